"""The end-to-end bench's arithmetic: /proc CPU times, py-spy's stacks sorted into categories,
the per-process split and the table (tests/bench/cpu_attribution.py, e2e_pipeline_bench.py)."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest

from tests.bench import cpu_attribution as cpu
from tests.bench.__main__ import _with_target
from tests.bench.e2e_pipeline_bench import MIX, cpu_table, mix, row

TICK = 1 / cpu.CLOCK_TICKS

OCR_LANE = (
    "Thread.run (/usr/lib/python3.11/threading.py:982)",
    "Lanes._thread (/repo/consumers/runtime/lanes.py:242)",
    "stage_handler.<locals>.handle (/repo/consumers/handler.py:112)",
)
EMBED = (
    *OCR_LANE,
    "EmbeddingStage.compute (/repo/consumers/embeddings/worker.py:113)",
    "0x7f (onnxruntime.so)",
)
ENCODE = (*OCR_LANE, "Codec.encode (/repo/schemas/codec.py:80)", "_write (fastavro/_write.so)")
PRODUCE = (*OCR_LANE, "LaneContext.emit (/repo/consumers/runtime/lanes.py:99)", "Producer_produce (cimpl.so)")
LOOP = (
    "Worker.run (/repo/consumers/runtime/loop.py:175)",
    "Worker._settle (/repo/consumers/runtime/loop.py:339)",
)
IDLE = (
    *LOOP,
    "_queue_SimpleQueue_get (_queuemodule.c:177)",
    "PyThread_acquire_lock_timed (libpython3.11.so)",
)


def test_a_stack_goes_to_its_first_matching_category() -> None:
    assert cpu.category(cpu.STAGE, EMBED) == cpu.COMPUTE
    assert cpu.category(cpu.STAGE, ENCODE) == cpu.AVRO
    assert cpu.category(cpu.STAGE, PRODUCE) == cpu.KAFKA
    assert cpu.category(cpu.STAGE, LOOP) == cpu.RUNTIME
    assert cpu.category(cpu.STAGE, ("<module> (/usr/lib/python3.11/logging/__init__.py:1)",)) == cpu.OTHER
    # Avro inside the sink's handler is Avro; the sink's own rows and inserts are the sink
    sink = (
        "Worker.run (/repo/consumers/runtime/loop.py:175)",
        "WarehouseSink.__call__ (/repo/consumers/warehouse/sink.py:1)",
    )
    assert cpu.category(cpu.SINK_KIND, (*sink, "Codec.decode (/repo/schemas/codec.py:90)")) == cpu.AVRO
    assert cpu.category(cpu.SINK_KIND, (*sink, "Connection.query (chdb/sqlitelike.py:756)")) == cpu.SINK
    # in the analytics process all that is neither Avro nor the Kafka client is faust's
    assert (
        cpu.category(cpu.ANALYTICS_KIND, ("BaseEventLoop._run_once (asyncio/base_events.py:1922)",))
        == cpu.ANALYTICS
    )
    assert cpu.category(cpu.ANALYTICS_KIND, ("Fetcher._fetch (aiokafka/consumer/fetcher.py:1)",)) == cpu.KAFKA


def test_waits_are_no_cpu_and_shares_sum_to_one() -> None:
    stacks = cpu.parse_raw(
        ";".join(EMBED)
        + " 6\n"
        + ";".join(ENCODE)
        + " 2\n"
        + ";".join(LOOP)
        + " 2\n"
        + ";".join(IDLE)
        + " 90\n"
        "garbage without a count\n"
    )
    assert sum(stacks.values()) == 100
    assert cpu.waiting(IDLE) and not cpu.waiting(EMBED)
    shares = cpu.shares(cpu.STAGE, stacks)
    assert shares == pytest.approx({cpu.COMPUTE: 0.6, cpu.AVRO: 0.2, cpu.RUNTIME: 0.2})
    assert cpu.shares(cpu.STAGE, cpu.parse_raw(";".join(IDLE) + " 5")) == {}


def test_stat_seconds_reads_utime_and_stime_past_a_name_with_spaces() -> None:
    fields = ["S"] + ["0"] * 10 + ["250", "50"] + ["0"] * 30  # fields 3.. of proc(5): utime 14, stime 15
    assert cpu.stat_seconds("123 (rdk:broker 1) " + " ".join(fields)) == pytest.approx(300 * TICK)


def test_snapshots_of_this_process_grow_with_its_work() -> None:
    before = cpu.cpu_snapshot(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    after = cpu.cpu_snapshot(os.getpid())
    assert after.total - before.total >= 0.2
    assert os.getpid() in after.threads  # the main thread's tid is the pid
    assert cpu.cpu_snapshot(2**22 + 1) == cpu.CpuSnapshot(0.0)  # past pid_max: gone


def test_thread_classes_and_the_split_of_one_process() -> None:
    before = cpu.CpuSnapshot(10.0, {1: ("python", 5.0), 2: ("rdk:main", 1.0), 3: ("python", 2.0)})
    after = cpu.CpuSnapshot(
        20.0, {1: ("python", 9.0), 2: ("rdk:main", 2.5), 3: ("python", 4.0), 4: ("rdk:b", 0.5)}
    )
    # tid 3 is not a Python thread (an onnxruntime pool's): native; what is left is Python's
    classes = cpu.thread_classes(before, after, python_tids=[1])
    assert classes == pytest.approx({"kafka": 2.0, "native": 2.0, "python": 6.0})
    # without py-spy's thread list no native thread is told apart
    assert cpu.thread_classes(before, after, None) == pytest.approx(
        {"kafka": 2.0, "native": 0.0, "python": 8.0}
    )
    split = cpu.split(cpu.STAGE, classes, {cpu.COMPUTE: 0.5, cpu.RUNTIME: 0.25, cpu.AVRO: 0.25})
    assert split == pytest.approx({cpu.COMPUTE: 5.0, cpu.KAFKA: 2.0, cpu.AVRO: 1.5, cpu.RUNTIME: 1.5})
    assert sum(split.values()) == pytest.approx(10.0)  # the process's CPU, all of it
    assert cpu.split(cpu.SINK_KIND, classes, {}) == pytest.approx(
        {cpu.KAFKA: 2.0, cpu.SINK: 2.0, cpu.OTHER: 6.0}
    )


def test_the_table_per_document_and_by_category() -> None:
    run = {
        "classes": {
            "ocr": {"kafka": 1.0, "native": 0.0, "python": 3.0},
            "sink": {"kafka": 0.5, "native": 1.5, "python": 2.0},
            "broker": {"kafka": 0.0, "native": 0.0, "python": 4.0},
        },
        "shares": {"ocr": {cpu.COMPUTE: 1 / 3, cpu.RUNTIME: 2 / 3}, "sink": {cpu.SINK: 0.5, cpu.AVRO: 0.5}},
    }
    table = cpu_table(run, documents=10)
    assert table == {
        "ocr": {cpu.COMPUTE: 100.0, cpu.KAFKA: 100.0, cpu.RUNTIME: 200.0},
        "sink": {cpu.KAFKA: 50.0, cpu.AVRO: 100.0, cpu.SINK: 250.0},
        "broker": {"all": 400.0},
    }
    summed = cpu.by_category(table, ["ocr"])
    assert summed == {
        "compute (ocr)": 100.0,
        cpu.KAFKA: 150.0,
        cpu.RUNTIME: 200.0,
        cpu.AVRO: 100.0,
        cpu.SINK: 250.0,
        "Kafka broker (JVM)": 400.0,
    }
    text = cpu.markdown(table, ["ocr"], wall_x_cores=2400.0)
    assert "| compute (ocr) | 100.0 | 8.3% |" in text
    assert "| **sum** | **1200.0** | 100% |" in text
    assert "| wall ms / document x cores | 2400.0 | 50.0% used |" in text


def test_the_mix_cycles_the_text_samples_with_distinct_contents() -> None:
    documents = mix(7)
    assert [d.content_type for d in documents[: len(MIX)]] == [t for _, t in MIX]
    assert len({d.content for d in documents}) == 7
    assert documents[0].content.startswith(b"%PDF") and b"Bench copy 2." in documents[2].content


def test_listening_pid_finds_the_process_that_listens() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert cpu.listening_pid(server.getsockname()[1]) == os.getpid()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening
        assert cpu.listening_pid(port) is None


def _bare(seconds: float, cpu_seconds: float) -> dict[str, Any]:
    per_stage = {"ocr": 0.1 * seconds, "embeddings": 0.4 * seconds, "thumbnails": 0.5 * seconds}
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "stage_seconds": per_stage,
        "stage_cpu_seconds": per_stage,
    }


def test_the_row_compares_documents_per_second_and_cpu_per_document() -> None:
    run = {
        "seconds": 20.0,
        "published_s": 2.0,
        "rollups": True,
        "rollups_after_s": 30.0,
        "classes": {"ocr": {"kafka": 1.0, "native": 0.0, "python": 3.0}, "broker": {"python": 8.0}},
        "shares": {},
        "idle_cpu": {"ocr": 0.01, "broker": 0.1},
        "samples": {},
    }
    # 100 documents: the baseline's rounds 30 s and 10 s (mean 20 s: 5/s), the pipeline 20 s (5/s)
    out = row(100, [_bare(30.0, 6.0), _bare(10.0, 6.0)], run, cores=2)
    assert (out["raw_eps"], out["ours_eps"], out["ratio"]) == (5.0, 5.0, 1.0)
    assert out["ratio_vs_best_bare"] == 0.5  # against the 10 s round alone
    assert out["cpu_ms_per_doc"] == 120.0 and out["bare_cpu_ms_per_doc"] == 60.0 and out["cpu_ratio"] == 0.5
    assert out["wall_ms_per_doc_x_cores"] == 400.0  # 20 s / 100 documents x 2 cores
    # the stages' mean seconds over the rounds (2, 8 and 10 s) per document
    assert out["bare_stage_ms_per_doc"] == {"ocr": 20.0, "embeddings": 80.0, "thumbnails": 100.0}
    assert out["incomplete"] == 0 and _with_target(out)["met"] is True
    # rollups that did not count every document: the row is not met, whatever its ratio
    assert _with_target(row(100, [_bare(10.0, 6.0)], {**run, "rollups": False}, 2))["met"] is False
