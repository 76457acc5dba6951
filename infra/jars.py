"""The local broker's jars: fetched from Maven Central once per infra/kafka/pom.xml.

`fetch_jars` runs `mvn dependency:copy-dependencies` into a staging folder and swaps the jars into
the lib dir one by one, so that a broker running from the old files keeps them; a marker file
holding the pom's digest says the lib dir is current (`jars_fetched`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from docstream.errors import BrokerError
from infra.processes import require_tool, run_tool

KAFKA_DIR = Path(__file__).resolve().parent / "kafka"
DEFAULT_LIB_DIR = KAFKA_DIR / "lib"
POM_PATH = KAFKA_DIR / "pom.xml"
FETCHED_MARKER = ".fetched"


def jars_fetched(lib_dir: Path) -> bool:
    """Whether the lib dir holds the jars of the current pom.xml."""
    marker = lib_dir / FETCHED_MARKER
    return marker.is_file() and marker.read_text().strip() == _pom_digest()


def fetch_jars(lib_dir: Path, *, mvn: str, java: str, timeout: float) -> bool:
    """Put the broker's jars into the lib dir with Maven; False when they were already there."""
    marker = lib_dir / FETCHED_MARKER
    if jars_fetched(lib_dir):
        marker.touch()  # keeps `make` from asking again when pom.xml is newer but unchanged
        return False
    mvn_path = require_tool(mvn, "mvn")
    require_tool(java, "java")
    staging = lib_dir / ".fetching"  # inside lib: git-ignored even if a fetch is cut short
    shutil.rmtree(staging, ignore_errors=True)
    command = [
        mvn_path,
        "-q",
        "-B",
        "-f",
        str(POM_PATH),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    output = run_tool(command, timeout, "mvn could not fetch the Kafka jars")
    if not any(staging.glob("kafka_*.jar")):
        raise BrokerError(f"mvn finished but fetched no Kafka jar into {staging}:\n{output}")
    _replace_jars(staging, lib_dir)
    marker.write_text(_pom_digest() + "\n")
    return True


def _replace_jars(staging: Path, lib_dir: Path) -> None:
    """Make lib_dir hold exactly the staged jars (two Kafka versions on one classpath would mix).

    Each jar is swapped in with os.replace, so a broker running from the old files keeps them.
    """
    lib_dir.mkdir(parents=True, exist_ok=True)
    fresh = {jar.name for jar in staging.glob("*.jar")}
    for jar in lib_dir.glob("*.jar"):
        if jar.name not in fresh:
            jar.unlink()
    for name in fresh:
        os.replace(staging / name, lib_dir / name)
    shutil.rmtree(staging, ignore_errors=True)


def _pom_digest() -> str:
    return hashlib.sha256(POM_PATH.read_bytes()).hexdigest()
