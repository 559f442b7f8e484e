"""Spark's Kafka source jars, resolved from Maven Central for the installed PySpark."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from rmq_semantics.embedded import cache_dir, resolve_maven_jars
from rmq_semantics.errors import ConfigError

__all__ = ["spark_kafka_jars", "spark_kafka_package", "spark_version"]

_ARTIFACT = re.compile(r"^(?P<name>.+?)-\d[\w.\-]*\.jar$")


def _pom() -> Path:
    return Path(str(resources.files("spark") / "pom.xml"))


def spark_version() -> str:
    match = re.search(r"<spark\.version>([^<]+)</spark\.version>", _pom().read_text())
    if not match:
        raise ConfigError(f"{_pom()} does not pin <spark.version>")
    return match.group(1)


def spark_kafka_package() -> str:
    """Maven coordinates for ``spark.jars.packages`` on a cluster that resolves its own."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version()}"


def _check_pyspark_matches() -> Path:
    import pyspark

    if pyspark.__version__ != spark_version():
        raise ConfigError(f"installed PySpark is {pyspark.__version__} but spark/pom.xml pins "
                          f"the Kafka source for {spark_version()}; install pyspark=="
                          f"{spark_version()}")
    return Path(pyspark.__file__).parent / "jars"


def spark_kafka_jars() -> list[str]:
    """Jar paths to hand to ``spark.jars``: the Kafka source and what PySpark lacks of its deps.

    Jars PySpark already ships (Scala, Hadoop, compression codecs) are left out so two
    versions of one library never meet on the classpath.
    """
    pyspark_jars = _check_pyspark_matches()
    shipped = {m.group("name") for p in pyspark_jars.glob("*.jar")
               if (m := _ARTIFACT.match(p.name))}
    libs = resolve_maven_jars(_pom(), cache_dir() / f"spark-kafka-{spark_version()}" / "libs",
                              "Spark Kafka source")
    return sorted(str(p) for p in libs.glob("*.jar")
                  if (m := _ARTIFACT.match(p.name)) and m.group("name") not in shipped)
