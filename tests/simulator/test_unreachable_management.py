"""#46: the demo keeps running when RabbitMQ's management API does not answer (its plugin
restarting): forced drops and crashes it cannot inject are skipped and said, the traffic and
the truth go on."""

import re

import pytest

from tests.helpers import free_port
from tests.simulator.helpers import simulate


@pytest.mark.slow  # seconds of real simulated traffic
def test_it_skips_the_faults_it_cannot_inject_and_says_so(clean_queues, amqp, tmp_path, settings):
    settings.RABBITMQ_MANAGEMENT_URL = f"http://guest:guest@127.0.0.1:{free_port()}/"
    truth, printed, _ = simulate(
        tmp_path, "--count", "60", "--rate", "60", "--drops", "2", "--crash", "0.2", "--seed", "7"
    )
    totals = truth["totals"]
    assert totals["connections_closed"] == 0 and totals["consumer_crashes"] == 0
    assert totals["lost"] == 0
    skipped = truth["rounds"][0]["faults_skipped"]
    assert skipped >= 3, printed  # both drops and at least one crash
    said = re.search(
        r"WARNING: round 1: (\d+) fault\(s\) skipped, the RabbitMQ management API is "
        r"unreachable: (forced drop|crash) not injected: GET /vhosts/\S+/connections\S*: "
        r"management API unreachable",
        printed,
    )
    assert said and int(said[1]) == skipped, printed
