//! Readiness for service managers: systemd's notify protocol (`sd_notify(3)`), a datagram
//! of `KEY=VALUE` lines to the Unix socket named by `$NOTIFY_SOCKET` (a path, or `@name`
//! in the abstract namespace). Nothing is sent when it is unset.
//!
//! The agent is ready (`READY=1`, once) when every namespace configured at start holds its
//! address: its own lease won in the DHT, or, for a namespace whose addresses come from the
//! agent's DHCP server (router mode, `address = "dhcp"`), the overlay joined and the subnet
//! known, so the server can answer. `STATUS=` says what it waits for, whenever that changes.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

/// Where one namespace is on its way to holding its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress<'a> {
    /// Namespace name.
    pub(crate) name: &'a str,
    /// Whether this member claims an address of its own (else its DHCP clients do).
    pub(crate) own_address: bool,
    /// The subnet is known (configured, or read from the namespace record).
    pub(crate) subnet_known: bool,
    /// The address this member holds, if it does.
    pub(crate) held: Option<std::net::Ipv4Addr>,
}

/// What the agent waits for, as one `STATUS=` line, and whether it is ready.
pub(crate) fn readiness(overlay_ready: bool, namespaces: &[Progress<'_>]) -> (bool, String) {
    if !overlay_ready {
        return (false, "joining the overlay (reaching a member)".into());
    }
    let mut held = Vec::new();
    for n in namespaces {
        if !n.subnet_known {
            return (
                false,
                format!("{}: waiting for the namespace record", n.name),
            );
        }
        match (n.own_address, n.held) {
            (true, None) => return (false, format!("{}: claiming an address", n.name)),
            (true, Some(a)) => held.push(format!("{} {a}", n.name)),
            (false, _) => held.push(format!("{} (DHCP)", n.name)),
        }
    }
    if held.is_empty() {
        return (true, "ready: no namespace configured".into());
    }
    (true, format!("ready: {}", held.join(", ")))
}

/// Sends readiness and status to the service manager, if one asked for it.
#[derive(Debug)]
pub(crate) struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    ready: bool,
    status: String,
    /// When the status was last worked out (once ready, at most every [`RECHECK`]).
    checked: Option<Instant>,
}

/// Once ready, how often the status is worked out again: the loop turns per packet batch,
/// and the status only changes on DHT time scales.
const RECHECK: Duration = Duration::from_secs(1);

impl Notifier {
    /// A notifier for `$NOTIFY_SOCKET`; inert when it is unset or unusable (logged).
    pub(crate) fn from_env() -> Self {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|path| {
            let opened = address(path.as_encoded_bytes())
                .and_then(|addr| Ok((UnixDatagram::unbound()?, addr)));
            match opened {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(socket = ?path, error = %e, "cannot use NOTIFY_SOCKET");
                    None
                }
            }
        });
        Self {
            target,
            ready: false,
            status: String::new(),
            checked: None,
        }
    }

    /// Whether to work the status out now: never without a service manager; every loop
    /// turn until ready, then every [`RECHECK`].
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if self.target.is_none() {
            return false;
        }
        if self.ready && self.checked.is_some_and(|t| now < t + RECHECK) {
            return false;
        }
        self.checked = Some(now);
        true
    }

    /// Reports `(ready, status)` from [`readiness`] if it changed. `READY=1` goes once.
    pub(crate) fn update(&mut self, (ready, status): (bool, String)) {
        if self.target.is_none() || (status == self.status && (self.ready || !ready)) {
            return;
        }
        let mut message = format!("STATUS={status}\n");
        if ready && !self.ready {
            message.insert_str(0, "READY=1\n");
            self.ready = true;
        }
        self.status = status;
        self.send(&message);
    }

    /// Tells the service manager the agent is stopping.
    pub(crate) fn stopping(&mut self) {
        self.send("STOPPING=1\nSTATUS=stopping: releasing addresses\n");
    }

    fn send(&self, message: &str) {
        if let Some((socket, addr)) = &self.target {
            if let Err(e) = socket.send_to_addr(message.as_bytes(), addr) {
                tracing::debug!(error = %e, "cannot notify the service manager");
            }
        }
    }
}

/// `$NOTIFY_SOCKET`: a filesystem path, or `@name` for the abstract namespace.
fn address(socket: &[u8]) -> std::io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt as _;
    use std::os::unix::ffi::OsStrExt as _;
    match socket.split_first() {
        Some((b'@', name)) => SocketAddr::from_abstract_name(name),
        Some((b'/', _)) => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(socket)),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an absolute path or @abstract name",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(subnet_known: bool, held: Option<&str>) -> Progress<'static> {
        Progress {
            name: "lab",
            own_address: true,
            subnet_known,
            held: held.map(|a| a.parse().unwrap()),
        }
    }

    #[test]
    fn ready_only_when_every_namespace_holds_its_address() {
        assert!(!readiness(false, &[ns(true, Some("10.0.0.2"))]).0);
        assert_eq!(
            readiness(true, &[ns(false, None)]),
            (false, "lab: waiting for the namespace record".into())
        );
        assert_eq!(
            readiness(true, &[ns(true, Some("10.0.0.2")), ns(true, None)]),
            (false, "lab: claiming an address".into())
        );
        let dhcp = Progress {
            own_address: false,
            ..ns(true, None)
        };
        assert_eq!(
            readiness(true, &[ns(true, Some("10.0.0.2")), dhcp]),
            (true, "ready: lab 10.0.0.2, lab (DHCP)".into())
        );
    }

    #[test]
    fn ready_goes_once_and_status_only_when_it_changes() {
        let dir = std::env::temp_dir().join(format!("hyphae-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut n = Notifier {
            target: Some((
                UnixDatagram::unbound().unwrap(),
                address(path.as_os_str().as_encoded_bytes()).unwrap(),
            )),
            ready: false,
            status: String::new(),
            checked: None,
        };
        let mut received = Vec::new();
        let recv = |received: &mut Vec<String>| {
            let mut buf = [0u8; 512];
            while let Ok(len) = listener.recv(&mut buf) {
                received.push(String::from_utf8_lossy(&buf[..len]).into_owned());
            }
        };
        n.update((false, "lab: claiming an address".into()));
        n.update((false, "lab: claiming an address".into()));
        n.update((true, "ready: lab 10.0.0.2".into()));
        n.update((true, "ready: lab 10.0.0.2".into()));
        n.update((true, "lab: claiming an address".into()));
        recv(&mut received);
        assert_eq!(
            received,
            [
                "STATUS=lab: claiming an address\n",
                "READY=1\nSTATUS=ready: lab 10.0.0.2\n",
                "STATUS=lab: claiming an address\n",
            ]
        );
        assert!(address(b"relative").is_err());
        assert!(address(b"@abstract").is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
