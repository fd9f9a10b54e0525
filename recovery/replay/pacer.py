"""The pace of a bulk replay: a token bucket for a job's rate (recovery.replay.runner)."""

import time


class Pacer:
    """A token bucket for a job's rate (msgs/s; None = as fast as confirms allow). At most half
    a second of tokens pile up, so a pause (a canary, a broker outage) is not followed by a
    burst, while the average over the job stays on the rate."""

    def __init__(self, rate, tokens=0.0):
        self.rate = rate or None
        self.tokens = tokens
        self.burst = max(1.0, self.rate * 0.5) if self.rate else 0.0
        self.last = time.monotonic()

    def allowance(self, now, wanted):
        """How many of ``wanted`` messages may go now (and spend their tokens)."""
        if not self.rate:
            return wanted
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        # The epsilon: 0.1 s x 100/s may come out as 9.999999 tokens, which is 10.
        count = min(wanted, int(self.tokens + 1e-9))
        self.tokens -= count
        return count

    def wait(self):
        """Seconds until the next token."""
        return max(0.001, (1.0 - self.tokens) / self.rate)
