"""The busiest stretch of a series of CPU readings, shared by
thread_cpu.py and proc_cpu.py."""


def busiest(samples, value, window=0.5):
    """The most CPU `value(reading)` grew by in any `window` seconds, per
    second, over `samples`: a list of `(time, reading)` in time order,
    where `value` gives CPU seconds so far from a reading."""
    best, j = 0.0, 0
    for t, reading in samples:
        # samples[j]: the latest sample at least `window` before this one.
        while j + 1 < len(samples) and t - samples[j + 1][0] >= window:
            j += 1
        t0, earlier = samples[j]
        if t - t0 >= window:
            best = max(best, (value(reading) - value(earlier)) / (t - t0))
    return best
