//! Traffic between the testbed's hosts through the overlay, checked by clients no one here
//! wrote: a TCP transfer (socat, sha256sum), a UDP stream (iperf3), and a web page as a
//! browser renders it (chromium).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{run, Host, Testbed};

impl Testbed {
    /// Sends `len` pseudo-random bytes (seeded by `port`) from `from` to `to` (at `address`,
    /// port `port`) over TCP, socat at both ends, and checks with sha256sum that they
    /// arrived whole. The sender gives up after `within`.
    pub fn tcp_transfer(
        &mut self,
        from: &Host,
        (to, address): (&Host, impl Into<std::net::IpAddr>),
        port: u16,
        len: usize,
        within: Duration,
    ) -> Result<()> {
        let address: std::net::IpAddr = address.into();
        // socat listens on IPv4 unless told; an IPv6 address goes in brackets.
        let (listen, connect) = match address {
            std::net::IpAddr::V4(a) => (
                format!("TCP-LISTEN:{port},reuseaddr"),
                format!("TCP:{a}:{port}"),
            ),
            std::net::IpAddr::V6(a) => (
                format!("TCP6-LISTEN:{port},reuseaddr"),
                format!("TCP6:[{a}]:{port}"),
            ),
        };
        let data = from.dir.join(format!("transfer-{port}.in"));
        let mut bytes = vec![0u8; len];
        let mut x: u64 = 0x2545f4914f6cdd1d ^ u64::from(port);
        for chunk in bytes.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        std::fs::write(&data, &bytes)?;
        drop(bytes);
        let out = to.dir.join(format!("transfer-{port}.out"));
        let log = self.dir().join(format!("socat-{port}.log"));
        let receiver = self.spawn(
            &to.ns,
            "socat",
            &[
                "-u",
                &listen,
                &format!("OPEN:{},creat,trunc", out.display()),
            ],
            &log,
        )?;
        std::thread::sleep(Duration::from_millis(300));
        let sent = self.ns_output(
            &from.ns,
            "timeout",
            &[
                &within.as_secs().max(1).to_string(),
                "socat",
                "-u",
                &format!("OPEN:{}", data.display()),
                &format!("{connect},retry=20,interval=0.2"),
            ],
        )?;
        if !sent.status.success() {
            bail!(
                "{} -> {address}:{port}: socat failed ({}): {}",
                from.name,
                sent.status,
                String::from_utf8_lossy(&sent.stderr)
            );
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.is_running(receiver) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let sums = run(
            "sha256sum",
            &[&data.display().to_string(), &out.display().to_string()],
        )?;
        let sums = String::from_utf8_lossy(&sums.stdout);
        let hashes: Vec<&str> = sums
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let arrived = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
        if hashes.len() != 2 || hashes[0] != hashes[1] || arrived != len as u64 {
            bail!(
                "{} -> {}: {arrived} of {len} bytes arrived, corrupted or cut: {sums}",
                from.name,
                to.name
            );
        }
        Ok(())
    }

    /// The kernel's count of UDP datagrams with a bad checksum in `ns` (`InCsumErrors` in
    /// `/proc/net/snmp`).
    pub fn udp_checksum_errors(&self, ns: &str) -> Result<u64> {
        let out = self.ns(ns, "cat", &["/proc/net/snmp"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
        let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
            bail!("no Udp counters in {ns}'s /proc/net/snmp");
        };
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == "InCsumErrors")
            .and_then(|(_, v)| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no InCsumErrors in {ns}'s /proc/net/snmp"))
    }

    /// Sends a UDP stream with iperf3 from `from` to `to` (at `address`, port `port`):
    /// datagrams of `len` bytes at `rate` (iperf3's `-b`) for `secs` seconds. Returns the
    /// datagrams sent and those the receiver counted lost.
    pub fn udp_stream(
        &mut self,
        from: &Host,
        to: &Host,
        address: impl Into<std::net::IpAddr>,
        port: u16,
        (rate, len, secs): (&str, usize, u32),
    ) -> Result<(u64, u64)> {
        let address: std::net::IpAddr = address.into();
        let port = port.to_string();
        let log = to.dir.join(format!("iperf3-udp-{port}.log"));
        self.spawn(&to.ns, "iperf3", &["-s", "-1", "-p", &port], &log)?;
        std::thread::sleep(Duration::from_millis(300));
        let (address, len, secs) = (address.to_string(), len.to_string(), secs.to_string());
        let out = self.ns(
            &from.ns,
            "iperf3",
            &[
                "-c", &address, "-p", &port, "-u", "-b", rate, "-l", &len, "-t", &secs, "-J",
            ],
        )?;
        let report: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("iperf3 -J output")?;
        let sum = &report["end"]["sum"];
        match (sum["packets"].as_u64(), sum["lost_packets"].as_u64()) {
            (Some(packets), Some(lost)) => Ok((packets, lost)),
            _ => bail!("no UDP result from iperf3: {report}"),
        }
    }

    /// The DOM of the page at `url` once a headless chromium in `host`'s namespace has run
    /// its scripts (3 s of virtual time: the page's first polls), with its profile in
    /// `profile`.
    pub fn rendered_page(
        &self,
        host: &Host,
        url: &str,
        profile: &std::path::Path,
    ) -> Result<String> {
        let out = self.ns_output(
            &host.ns,
            "chromium",
            &[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                &format!("--user-data-dir={}", profile.display()),
                "--virtual-time-budget=3000",
                "--dump-dom",
                url,
            ],
        )?;
        if !out.status.success() {
            bail!("chromium failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
