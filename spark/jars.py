"""The jars the Spark job needs beyond PySpark (Kafka source, spark-avro), from Maven Central.

``spark/pom.xml`` lists them and pins the Spark release; they are resolved once into the
cache (``spark-kafka-<version>/libs``, the layout the Spark image pre-fills).
"""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

from rmq_semantics.errors import ConfigError
from rmq_semantics.kafka_jars import cache_dir, resolve_maven_jars

__all__ = ["spark_jars", "spark_packages", "spark_version"]

_ARTIFACT = re.compile(r"^(?P<name>.+?)-\d[\w.\-]*\.jar$")
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _pom() -> Path:
    return Path(str(resources.files("spark") / "pom.xml"))


def spark_version() -> str:
    match = re.search(r"<spark\.version>([^<]+)</spark\.version>", _pom().read_text())
    if not match:
        raise ConfigError(f"{_pom()} does not pin <spark.version>")
    return match.group(1)


def _dependencies() -> list[tuple[str, str]]:
    """(groupId, artifactId) of each dependency the pom lists."""
    root = ET.parse(_pom()).getroot()
    return [
        (dep.findtext("m:groupId", "", _POM_NS), dep.findtext("m:artifactId", "", _POM_NS))
        for dep in root.iterfind("m:dependencies/m:dependency", _POM_NS)
    ]


def spark_packages() -> str:
    """Maven coordinates for ``spark.jars.packages`` on a cluster that resolves its own."""
    return ",".join(f"{group}:{artifact}:{spark_version()}" for group, artifact in _dependencies())


def _check_pyspark_matches() -> Path:
    import pyspark

    if pyspark.__version__ != spark_version():
        raise ConfigError(
            f"installed PySpark is {pyspark.__version__} but spark/pom.xml pins "
            f"the Spark jars for {spark_version()}; install pyspark=="
            f"{spark_version()}"
        )
    return Path(pyspark.__file__).parent / "jars"


def _names(jars: Path) -> set[str]:
    return {m.group("name") for p in jars.glob("*.jar") if (m := _ARTIFACT.match(p.name))}


def spark_jars() -> list[str]:
    """Jar paths to hand to ``spark.jars``: what the pom lists and what PySpark lacks of
    their dependencies.

    Jars PySpark already ships (Scala, Hadoop, Avro, compression codecs) are left out so
    two versions of one library never meet on the classpath. A cache resolved from an
    older pom (one artifact missing) is resolved again.
    """
    shipped = _names(_check_pyspark_matches())
    version = spark_version()
    target = cache_dir() / f"spark-kafka-{version}" / "libs"
    listed = [target / f"{artifact}-{version}.jar" for _, artifact in _dependencies()]
    if target.is_dir() and not all(jar.is_file() for jar in listed):
        shutil.rmtree(target)
    libs = resolve_maven_jars(_pom(), target, "Spark Kafka source and spark-avro")
    return sorted(
        str(p)
        for p in libs.glob("*.jar")
        if (m := _ARTIFACT.match(p.name)) and m.group("name") not in shipped
    )
