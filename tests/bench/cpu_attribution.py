"""Where the pipeline's CPU goes: the processes' CPU times from /proc, split by py-spy's stacks.

Two measurements, combined per process (`split`):

1. `/proc/<pid>/stat` (the process's user + system CPU, dead threads included) and
   `/proc/<pid>/task/<tid>/stat` (each live thread's), read at the start and the end of the
   measured span (`cpu_snapshot`). A thread named `rdk:*` is librdkafka's own (the Kafka client);
   the Python threads are those py-spy lists (`python_tids`, from `py-spy dump --json`); every
   other thread (onnxruntime's and pdfium's pools, chDB's) is native work of the process's kind
   (`NATIVE_OF`). What neither live-thread class accounts for (threads that ended meanwhile) counts
   with the Python threads.
2. py-spy's samples of the Python threads (`py-spy record --native --full-filenames -f raw`: only
   threads that are running, idle ones are left out), each stack sorted into one category
   (`category`); the Python threads' CPU is shared out in proportion to the samples.

The categories, first match wins, over all frames of a stack (`RULES`):
compute (the stage's prepare and compute: blob read, render, OCR, chunk, embed, thumbnails),
Avro (schemas.codec, fastavro), Kafka client (confluent-kafka, librdkafka, aiokafka), sink
(consumers.warehouse, chDB), analytics (faust, mode, consumers.analytics), runtime (the consumer
runtime, the stage handler, docstream's own modules, threads and queues), other (start-up
leftovers, logging, the interpreter's own frames).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
COMPUTE, AVRO, KAFKA, SINK, ANALYTICS, RUNTIME, OTHER = (
    "compute",
    "Avro",
    "Kafka client",
    "sink",
    "analytics (faust)",
    "runtime",
    "other",
)
CATEGORIES = (COMPUTE, KAFKA, AVRO, RUNTIME, SINK, ANALYTICS, OTHER)
STAGE, SINK_KIND, ANALYTICS_KIND = "stage", "sink", "analytics"

_COMPUTE: tuple[str, ...] = ("/consumers/stage.py", "/consumers/ocr/", "/consumers/embeddings/")
_COMPUTE += ("/consumers/thumbnails/", "/consumers/pages.py")
_AVRO = ("/schemas/", "fastavro")
_KAFKA = ("confluent_kafka", "librdkafka", "rd_kafka", "(cimpl.", "aiokafka")
_SINK = ("/consumers/warehouse/", "chdb", "libclickhouse", "_chdb")
_ANALYTICS = ("/faust/", "/mode/", "/consumers/analytics/", "/venusian/", "/yarl/")
_RUNTIME = ("/consumers/", "/docstream/", "/producers/", "threading.py", "queue.py", "/concurrent/")
# Per kind of process: the categories to try, in order; the first one a frame of the stack matches.
RULES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    STAGE: ((COMPUTE, _COMPUTE), (AVRO, _AVRO), (KAFKA, _KAFKA), (RUNTIME, _RUNTIME)),
    SINK_KIND: ((AVRO, _AVRO), (KAFKA, _KAFKA), (SINK, _SINK), (RUNTIME, _RUNTIME)),
    ANALYTICS_KIND: ((AVRO, _AVRO), (KAFKA, _KAFKA), (ANALYTICS, ("",))),  # all the rest: faust's
}
# Native threads that are neither Python's nor librdkafka's: whose work they are, per kind.
NATIVE_OF = {STAGE: COMPUTE, SINK_KIND: SINK, ANALYTICS_KIND: ANALYTICS}


# A sample whose innermost frames are one of these waits: no CPU (py-spy's --native keeps threads
# blocked in a lock, a condition or a poll, the interpreter lock's wait included, as active).
WAITS = (
    "PyThread_acquire_lock_timed",
    "pthread_cond_timedwait",
    "pthread_cond_wait",
    "pthread_cond_clockwait",
    "sem_timedwait",
    "sem_clockwait",
    "sem_wait",
    "epoll_wait",
    "clock_nanosleep",
    "select (",
    "poll (",
    "futex",
    "take_gil",
)
WAIT_DEPTH = 4  # innermost frames looked at


def waiting(frames: Sequence[str]) -> bool:
    """Whether a sampled stack is a thread waiting (a lock, a condition, a poll, the GIL)."""
    return any(wait in frame for frame in frames[-WAIT_DEPTH:] for wait in WAITS)


def category(kind: str, frames: Sequence[str]) -> str:
    """The category of one sampled stack (py-spy's frames, `func (file:line)`) in a process of
    `kind` (STAGE, SINK_KIND, ANALYTICS_KIND): the first rule of `RULES[kind]` a frame matches."""
    for name, markers in RULES[kind]:
        if any(marker in frame for frame in frames for marker in markers):
            return name
    return OTHER


def parse_raw(text: str) -> Counter[tuple[str, ...]]:
    """py-spy's raw (collapsed) output: `frame;frame;... count` per line -> stack -> samples."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def shares(kind: str, stacks: Mapping[tuple[str, ...], int]) -> dict[str, float]:
    """Category -> its share of the samples that are not waits (summing to 1; empty without any)."""
    counts: Counter[str] = Counter()
    for stack, n in stacks.items():
        if not waiting(stack):
            counts[category(kind, stack)] += n
    total = sum(counts.values())
    return {name: n / total for name, n in counts.items()} if total else {}


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds of one process at one instant: its total, and each live thread's (tid -> (name,
    seconds))."""

    total: float
    threads: dict[int, tuple[str, float]] = field(default_factory=dict)


def stat_seconds(stat: str) -> float:
    """utime + stime (seconds) of a /proc stat line (the name in parentheses may hold spaces)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5)


def cpu_snapshot(pid: int, proc: Path = Path("/proc")) -> CpuSnapshot:
    """The process's CPU seconds and each live thread's; a zero snapshot once it has gone."""
    try:
        total = stat_seconds((proc / str(pid) / "stat").read_text())
    except (FileNotFoundError, ProcessLookupError):
        return CpuSnapshot(0.0)
    threads = {}
    for task in (proc / str(pid) / "task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            threads[int(task.name)] = (name, stat_seconds((task / "stat").read_text()))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # the thread ended meanwhile
    return CpuSnapshot(total, threads)


def thread_classes(
    before: CpuSnapshot, after: CpuSnapshot, python_tids: Iterable[int] | None
) -> dict[str, float]:
    """CPU seconds between two snapshots by thread class: `kafka` (librdkafka's `rdk:*` threads),
    `native` (threads neither Python's nor librdkafka's; without `python_tids` none is told
    apart: 0) and `python` (the rest, threads that ended meanwhile included)."""
    python = set(python_tids or ())
    kafka = native = 0.0
    for tid, (name, seconds) in after.threads.items():
        spent = seconds - before.threads.get(tid, (name, 0.0))[1]
        if name.startswith("rdk:"):
            kafka += spent
        elif python_tids is not None and tid not in python:
            native += spent
    total = after.total - before.total
    return {"kafka": kafka, "native": native, "python": max(0.0, total - kafka - native)}


def split(kind: str, classes: Mapping[str, float], python_shares: Mapping[str, float]) -> dict[str, float]:
    """Category -> CPU seconds of one process: librdkafka's threads to the Kafka client, the other
    native threads to their kind's work (`NATIVE_OF`), the Python threads' time by the samples'
    shares (all of it to `other` where there are no samples)."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    out[KAFKA] += classes.get("kafka", 0.0)
    out[NATIVE_OF[kind]] += classes.get("native", 0.0)
    python = classes.get("python", 0.0)
    for name, share in (python_shares or {OTHER: 1.0}).items():
        out[name] += python * share
    return {name: seconds for name, seconds in out.items() if seconds}


def listening_pid(port: int, proc: Path = Path("/proc")) -> int | None:
    """The process listening on TCP `port` (the broker's JVM), by the socket's inode; None if none
    of ours is."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            parts = line.split()
            if parts[1].rsplit(":", 1)[1] == f"{port:04X}" and parts[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{parts[9]}]")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except (PermissionError, FileNotFoundError, ProcessLookupError, NotADirectoryError):
            continue
    return None


BROKER, BENCH = "broker", "bench"  # the rows of the broker's JVM and of the bench's own process
OUTSIDE = {BROKER: "Kafka broker (JVM)", BENCH: "publisher and the bench's polls (its process)"}


def by_category(per_process: Mapping[str, Mapping[str, float]], stages: Iterable[str]) -> dict[str, float]:
    """Process -> category -> ms per document, summed over the processes per category; compute
    apart per stage (`compute (ocr)`); the broker's and the bench's rows (`OUTSIDE`) as they are."""
    stages = set(stages)
    out: dict[str, float] = {}
    for process, categories in per_process.items():
        for name, ms in categories.items():
            if process in OUTSIDE:
                key = OUTSIDE[process]
            elif name == COMPUTE and process in stages:
                key = f"{COMPUTE} ({process})"
            else:
                key = name
            out[key] = out.get(key, 0.0) + ms
    return out


def markdown(
    per_process: Mapping[str, Mapping[str, float]], stages: Sequence[str], wall_x_cores: float
) -> str:
    """The table of docs/benchmarks.md: CPU ms per document by category, its share, and the sum
    against the wall time per document times the cores."""
    summed = by_category(per_process, stages)
    total = sum(summed.values())
    order = (
        [f"{COMPUTE} ({s})" for s in stages]
        + [c for c in CATEGORIES if c != COMPUTE]
        + list(OUTSIDE.values())
    )
    lines = ["| where | CPU ms / document | share |", "|---|---:|---:|"]
    lines += [f"| {key} | {summed[key]:.1f} | {summed[key] / total:.1%} |" for key in order if key in summed]
    lines.append(f"| **sum** | **{total:.1f}** | 100% |")
    lines.append(f"| wall ms / document x cores | {wall_x_cores:.1f} | {total / wall_x_cores:.1%} used |")
    return "\n".join(lines)
