"""The connection watch: librdkafka's errors and log lines in, one outage line out (no broker)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from confluent_kafka import KafkaError

from docstream.kafka.connection import ConnectionWatch

ALL_DOWN = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
REFUSED = KafkaError(
    KafkaError._TRANSPORT,
    "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused "
    "(after 0ms in state CONNECT)",
)
START = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Probe:
    """A metadata probe whose answer the test sets; counts its calls."""

    def __init__(self) -> None:
        self.answers = False
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.answers


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def watch(clock: Clock) -> ConnectionWatch:
    return ConnectionWatch("docstream.thumbnails", clock=clock, probe_every_s=2.0, repeat_after_s=60.0)


def watch_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "docstream.kafka"]


def refusals(watch: ConnectionWatch, clock: Clock, seconds: int) -> None:
    """What three clients report about a broker that refuses connections, for `seconds`."""
    for _ in range(seconds * 20):
        clock.now += 0.05
        watch.on_error(REFUSED)
        watch.on_log(logging.ERROR, "FAIL", "rdkafka#consumer-1", REFUSED.str())
    watch.on_error(ALL_DOWN)


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    watch: ConnectionWatch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    probe = Probe()
    watch.on_error(ALL_DOWN)
    for _ in range(30):  # the loop turns; the brokers stay away for a minute
        watch.check(probe)
        refusals(watch, clock, 2)
    probe.answers = True
    clock.now += 2
    watch.check(probe)
    for _ in range(5):
        clock.now += 2
        watch.check(probe)

    lines = watch_lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0] == (
        "docstream.thumbnails: Kafka broker(s) unreachable since 2027-01-15T08:00:00+00:00 "
        "(1/1 brokers are down); retrying, quiet until they answer"
    )
    assert lines[1] == "docstream.thumbnails: Kafka broker(s) back after 62 s"
    assert [r.levelno for r in caplog.records if r.name == "docstream.kafka"] == [
        logging.WARNING,
        logging.INFO,
    ]
    assert {r.levelno for r in caplog.records if r.name == "docstream.kafka.librdkafka"} == {logging.DEBUG}


def test_an_error_a_probe_contradicts_is_no_outage(
    watch: ConnectionWatch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """One broker of several, or an idle connection the broker closed: a broker still answers."""
    probe = Probe()
    probe.answers = True
    watch.on_error(REFUSED)
    watch.check(probe)
    assert probe.calls == 1
    assert watch_lines(caplog) == []
    assert watch.state().reachable and watch.state().outages == 0


def test_a_broker_that_still_answers_while_it_shuts_down_is_reported_once_it_is_gone(
    watch: ConnectionWatch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka reports a broker that is down once, not at each failed reconnect: a probe that
    succeeds right after the error does not end the suspicion."""
    probe = Probe()
    probe.answers = True
    watch.on_error(REFUSED)
    watch.check(probe)
    clock.now += 2
    probe.answers = False  # gone now; no new error comes
    watch.check(probe)
    assert watch_lines(caplog) == [
        "docstream.thumbnails: Kafka broker(s) unreachable since 2027-01-15T08:00:00+00:00 "
        f"({REFUSED.str()}); retrying, quiet until they answer"
    ]


def test_a_suspicion_ends_quietly_once_the_probes_succeed_for_a_while(
    watch: ConnectionWatch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    probe = Probe()
    probe.answers = True
    watch.on_error(REFUSED)
    for _ in range(6):  # 10 s of successful probes after the error
        watch.check(probe)
        clock.now += 2
    probe.answers = False
    calls = probe.calls
    watch.check(probe)
    assert probe.calls == calls, "no suspicion left: nothing to probe"
    assert watch_lines(caplog) == [] and watch.state().reachable


def test_the_probe_runs_only_on_suspicion_and_then_every_probe_interval(
    watch: ConnectionWatch, clock: Clock
) -> None:
    probe = Probe()
    for _ in range(100):
        watch.check(probe)
    assert probe.calls == 0, "nothing is probed while no error came"

    watch.on_error(ALL_DOWN)
    watch.check(probe)
    assert probe.calls == 1, "a suspicion is checked at once"
    for _ in range(19):
        clock.now += 0.1
        watch.check(probe)
        watch.on_error(ALL_DOWN)
    assert probe.calls == 1
    clock.now += 0.2
    watch.check(probe)
    assert probe.calls == 2


def test_state_says_since_when_and_how_long_the_last_outage_lasted(
    watch: ConnectionWatch, clock: Clock
) -> None:
    probe = Probe()
    assert watch.state().reachable and watch.state().down_since is None
    watch.on_error(ALL_DOWN)
    clock.now += 1
    watch.check(probe)
    state = watch.state()
    assert not state.reachable and state.outages == 1
    assert state.down_since == datetime.fromtimestamp(START, UTC), "dated from the first error"
    clock.now += 9
    probe.answers = True
    watch.check(probe)
    state = watch.state()
    assert state.reachable and state.down_since is None
    assert state.last_outage_s == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("facility", "text"),
    [
        ("FAIL", "127.0.0.1:9092/1: Disconnected: connection closed by peer (after 11234ms in state UP)"),
        ("REQTMOUT", "127.0.0.1:9092/1: Timed out 1 in-flight request(s)"),
        ("GETPID", "Failed to acquire idempotence PID: Coordinator load in progress: retrying"),
    ],
)
def test_connection_chatter_goes_to_debug(
    watch: ConnectionWatch, caplog: pytest.LogCaptureFixture, facility: str, text: str
) -> None:
    caplog.set_level(logging.DEBUG)
    watch.on_log(logging.WARNING, facility, "rdkafka#producer-3", text)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, f"{facility} [rdkafka#producer-3] {text}")
    ]


def test_other_lines_keep_their_level_once_a_minute(
    watch: ConnectionWatch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    line = "Application maximum poll interval (300000ms) exceeded by 812ms"
    for _ in range(5):
        watch.on_log(logging.WARNING, "MAXPOLL", "rdkafka#consumer-1", line)
        clock.now += 10
    clock.now += 10  # a minute after the first
    watch.on_log(logging.WARNING, "MAXPOLL", "rdkafka#consumer-1", line.replace("812", "904"))
    assert [r.levelno for r in caplog.records] == [logging.WARNING, *[logging.DEBUG] * 4, logging.WARNING]


def test_every_client_line_is_quiet_while_an_outage_is_suspected_or_known(
    watch: ConnectionWatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    watch.on_error(ALL_DOWN)
    watch.on_log(logging.WARNING, "SESSTMOUT", "rdkafka#consumer-1", "Consumer group session timed out")
    watch.check(Probe())
    watch.on_log(logging.WARNING, "COMMITFAIL", "rdkafka#consumer-1", "Offset commit failed")
    levels = {
        r.getMessage().split(" ")[0]: r.levelno for r in caplog.records if r.name.endswith("librdkafka")
    }
    assert levels["SESSTMOUT"] == levels["COMMITFAIL"] == logging.DEBUG


def test_other_errors_are_warnings_and_fatal_ones_errors(
    watch: ConnectionWatch, caplog: pytest.LogCaptureFixture
) -> None:
    watch.on_error(KafkaError(KafkaError._MSG_TIMED_OUT, "1 message timed out"))
    watch.on_error(KafkaError(KafkaError._FATAL, "producer fenced", fatal=True))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "ERROR [docstream.thumbnails] _MSG_TIMED_OUT: 1 message timed out"),
        (logging.ERROR, "docstream.thumbnails: fatal: producer fenced"),
    ]
    assert watch.state().reachable


REFUSED_PASSWORD = KafkaError(
    KafkaError._AUTHENTICATION,
    "sasl_ssl://127.0.0.1:9094/bootstrap: SASL authentication error: Authentication failed during"
    " authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 12ms in state"
    " AUTH_REQ)",
)
UNKNOWN_CA = KafkaError(
    KafkaError._SSL,
    "sasl_ssl://127.0.0.1:9094/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate"
    " verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly"
    " configured or root CA certificates are installed (after 4ms in state SSL_HANDSHAKE)",
)


@pytest.mark.parametrize(
    ("error", "setting"),
    [(REFUSED_PASSWORD, "DOCSTREAM_SASL_PASSWORD"), (UNKNOWN_CA, "DOCSTREAM_SSL_CA_LOCATION")],
)
def test_refused_credentials_are_one_line_naming_the_setting_and_one_when_they_work(
    watch: ConnectionWatch, clock: Clock, caplog: pytest.LogCaptureFixture, error: KafkaError, setting: str
) -> None:
    """A worker with a wrong password (or a CA that did not sign the broker's certificate) keeps
    trying: one line when it starts, naming what to fix, one when the credentials work again."""
    caplog.set_level(logging.DEBUG)
    probe = Probe()
    for _ in range(100):  # librdkafka retries the connection, and says so every time
        clock.now += 0.5
        watch.on_error(error)
        watch.check(probe)
    assert not watch.state().reachable
    probe.answers = True  # the password fixed in the broker, or the right CA mounted
    clock.now += 2
    watch.check(probe)
    lines = watch_lines(caplog)
    assert len(lines) == 2, lines
    assert "unreachable since" in lines[0] and setting in lines[0]
    assert "back after" in lines[1]
    assert watch.state().reachable


def test_the_client_callbacks_never_raise(watch: ConnectionWatch) -> None:
    """An exception would come back from the client's next poll, mangled into a SystemError."""
    logger = watch.client_config()["logger"]
    logger.log(logging.INFO, "%s [%s] %s", "FAIL")  # not the arguments confluent-kafka passes
    watch.client_config()["error_cb"](None)


GROUP_REFUSED = KafkaError(
    KafkaError.GROUP_AUTHORIZATION_FAILED, "JoinGroup failed: Broker: Group authorization failed"
)


def test_a_refusal_is_one_line_and_in_the_state_until_work_is_accepted(
    watch: ConnectionWatch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose principal lacks an ACL: the cluster answers, so no outage; one ERROR line
    naming what to fix however often the consumer reports it, the state says why, one line when
    it goes through again."""
    caplog.set_level(logging.DEBUG)
    for _ in range(50):
        clock.now += 1
        watch.refused(GROUP_REFUSED, "this principal has no ACL for it")
    state = watch.state()
    assert state.reachable and state.refused is not None and "GROUP_AUTHORIZATION_FAILED" in state.refused
    clock.now += 10
    watch.accepted()
    watch.accepted()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "docstream.kafka"]
    assert lines == [
        (
            logging.ERROR,
            "docstream.thumbnails: refused by the Kafka cluster: JoinGroup failed: Broker: Group"
            " authorization failed (GROUP_AUTHORIZATION_FAILED); this principal has no ACL for it",
        ),
        (logging.INFO, "docstream.thumbnails: the Kafka cluster accepts this principal again after 59 s"),
    ]
    assert watch.state().refused is None
