"""Without the ``kafka`` extra, importing the Kafka connector fails with one
line naming the extra to install (no broker needed here)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_connector_without_confluent_kafka_names_the_extra():
    code = (
        "import sys\n"
        "sys.modules['confluent_kafka'] = None  # as if not installed\n"
        "try:\n"
        "    import millpond.connectors.kafka\n"
        "except ImportError as ex:\n"
        "    print(ex)\n"
        "else:\n"
        "    print('imported')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines == ["millpond.connectors.kafka needs confluent-kafka: pip install 'millpond[kafka]'"], res.stdout


def test_the_rest_of_millpond_does_not_need_it():
    code = (
        "import sys\n"
        "sys.modules['confluent_kafka'] = None\n"
        "import millpond.operators, millpond.connectors.files, millpond.testing\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "ok", res.stderr
