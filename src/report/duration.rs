//! How the report writes lengths of time: short, with a unit, the same
//! bytes for the same number.

use super::timeline::Micros;

/// `850µs`, `12.3ms`, `1.52s`, `2m 03s`, `1h 05m`.
pub fn fmt_duration(us: Micros) -> String {
    let us = us.max(0);
    if us < 1_000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else if us < 60_000_000 {
        format!("{:.2}s", us as f64 / 1e6)
    } else if us < 3_600_000_000 {
        let s = us / 1_000_000;
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        let m = us / 60_000_000;
        format!("{}h {:02}m", m / 60, m % 60)
    }
}

/// A tick step for an axis over `span` µs with about `ticks` ticks:
/// 1, 2 or 5 times a power of ten below a minute, whole minutes or hours
/// above.
pub fn tick_step(span: Micros, ticks: i64) -> Micros {
    let raw = (span.max(1) + ticks - 1) / ticks.max(1);
    if raw > 60_000_000 {
        for minutes in [1, 2, 5, 10, 15, 30, 60, 120, 240, 480, 720, 1440] {
            let step = minutes * 60_000_000;
            if step >= raw {
                return step;
            }
        }
        const DAY: Micros = 86_400_000_000;
        return (raw + DAY - 1) / DAY * DAY;
    }
    let mut mag: Micros = 1;
    loop {
        for m in [1, 2, 5] {
            if m * mag >= raw {
                return m * mag;
            }
        }
        mag *= 10;
    }
}

/// An axis label at `t` for ticks `step` apart: `0`, `40ms`, `1.5s`, `2m`.
pub fn fmt_tick(t: Micros, step: Micros) -> String {
    if t == 0 {
        return "0".to_owned();
    }
    if step >= 60_000_000 {
        let m = t / 60_000_000;
        return if m >= 60 && m % 60 == 0 {
            format!("{}h", m / 60)
        } else if m >= 60 {
            format!("{}h{:02}m", m / 60, m % 60)
        } else {
            format!("{m}m")
        };
    }
    let (unit, name) = if step < 1_000 {
        (1, "µs")
    } else if step < 100_000 {
        (1_000, "ms")
    } else {
        (1_000_000, "s")
    };
    let mut decimals = 0usize;
    let mut scaled = step;
    while scaled % unit != 0 && decimals < 3 {
        scaled *= 10;
        decimals += 1;
    }
    format!("{:.*}{name}", decimals, t as f64 / unit as f64)
}

#[cfg(test)]
mod tests {
    use super::{fmt_duration, fmt_tick, tick_step};

    #[test]
    fn durations_pick_their_unit() {
        assert_eq!(fmt_duration(850), "850µs");
        assert_eq!(fmt_duration(12_345), "12.3ms");
        assert_eq!(fmt_duration(1_520_000), "1.52s");
        assert_eq!(fmt_duration(123_000_000), "2m 03s");
        assert_eq!(fmt_duration(3_900_000_000), "1h 05m");
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(84_000, 8), 20_000);
        assert_eq!(tick_step(1_000_000, 8), 200_000);
        assert_eq!(tick_step(7, 8), 1);
        assert_eq!(tick_step(600_000_000, 8), 120_000_000);
        assert_eq!(fmt_tick(40_000, 20_000), "40ms");
        assert_eq!(fmt_tick(1_500_000, 500_000), "1.5s");
        assert_eq!(fmt_tick(400_000, 200_000), "0.4s");
        assert_eq!(fmt_tick(5_000, 1_000), "5ms");
        assert_eq!(fmt_tick(240_000_000, 120_000_000), "4m");
    }
}
