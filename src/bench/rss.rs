//! Peak resident memory of this process (`VmHWM` in `/proc/self/status`).
//! It is process-wide and only grows, so `troupe bench` measures each run
//! in a child process of its own to get that run's peak.

/// The peak RSS in KiB, or `None` where `/proc` is not available.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_high_water_mark() {
        let status = "Name:\ttroupe\nVmPeak:\t  1000 kB\nVmHWM:\t    5120 kB\nVmRSS:\t 4000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(5120));
        assert_eq!(parse_vm_hwm("Name: x\n"), None);
    }
}
