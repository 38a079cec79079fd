//! The underlay: where tunnel datagrams enter and leave the host. Always a UDP socket on
//! the listen address ([`socket`]); with `underlay = "af_xdp"` or `"auto"`, also an
//! AF_XDP path ([`afxdp`]) that receives the tunnel port's datagrams before the kernel's
//! UDP stack and sends those whose next hop the kernel resolved. The socket stays: it
//! holds the port, carries what the AF_XDP path cannot (IPv6 sends, unresolved next hops,
//! fragments, datagrams larger than a frame), and is the whole underlay when AF_XDP
//! cannot attach. The data path sees one [`Underlay`] either way.

mod afxdp;
pub(crate) mod bpf;
mod neighbour;
mod socket;
mod xsk;

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use anyhow::Result;

use crate::config::UnderlayMode;
use afxdp::{AfXdp, Push};

/// One received datagram.
pub(crate) struct Datagram<'a> {
    /// Who sent it.
    pub(crate) from: SocketAddr,
    /// Its bytes.
    pub(crate) bytes: &'a [u8],
}

/// The underlay socket, and the AF_XDP path when it attached.
pub(crate) struct Underlay {
    socket: socket::Socket,
    xdp: Option<AfXdp>,
}

impl Underlay {
    /// Takes over a bound, non-blocking socket; attaches AF_XDP to the listen address's
    /// interface if `mode` asks for it, and falls back to the socket alone (one log line)
    /// when it cannot.
    pub(crate) fn new(socket: std::net::UdpSocket, mode: UnderlayMode) -> Result<Self> {
        let listen = socket.local_addr()?;
        let socket = socket::Socket::new(socket)?;
        let xdp = match mode {
            UnderlayMode::Socket => None,
            UnderlayMode::AfXdp | UnderlayMode::Auto => match AfXdp::open(listen) {
                Ok(x) => {
                    tracing::info!(
                        interface = %x.interface,
                        queues = x.queues(),
                        xdp = x.xdp_mode,
                        zero_copy = x.zero_copy(),
                        "underlay: AF_XDP attached"
                    );
                    Some(x)
                }
                Err(e) if mode == UnderlayMode::AfXdp => {
                    tracing::warn!("underlay: AF_XDP unavailable, using the UDP socket: {e:#}");
                    None
                }
                Err(e) => {
                    tracing::info!("underlay: AF_XDP unavailable, using the UDP socket: {e:#}");
                    None
                }
            },
        };
        Ok(Self { socket, xdp })
    }

    /// Waits until datagrams can be read from either path.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        match &self.xdp {
            None => self.socket.readable().await,
            Some(x) => tokio::select! {
                r = self.socket.readable() => r,
                r = x.readable() => r,
            },
        }
    }

    /// Reads one batch from each path without waiting; `Ok(false)` when there was nothing.
    pub(crate) fn try_recv(&mut self) -> io::Result<bool> {
        let xdp = self.xdp.as_mut().is_some_and(AfXdp::try_recv);
        match self.socket.try_recv() {
            Ok(socket) => Ok(socket || xdp),
            Err(e) if xdp => {
                tracing::debug!(error = %e, "underlay socket receive error");
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// The datagrams of the last batch.
    pub(crate) fn datagrams(&self) -> impl Iterator<Item = Datagram<'_>> {
        self.socket
            .datagrams()
            .chain(self.xdp.iter().flat_map(AfXdp::datagrams))
    }

    /// Queues a datagram on the AF_XDP path if it can carry it, else on the socket.
    pub(crate) async fn push(&mut self, to: SocketAddr, datagram: &[u8]) {
        if let Some(x) = &mut self.xdp {
            // What the socket holds for this destination leaves first: no reordering
            // when a next hop becomes known.
            let mut pushed = x.push(to, datagram);
            if matches!(pushed, Push::Queued | Push::Full) && self.socket.pending_to() == Some(to) {
                self.socket.flush().await;
            }
            if matches!(pushed, Push::Full) {
                x.flush().await;
                pushed = x.push(to, datagram);
            }
            match pushed {
                Push::Queued => return,
                Push::Full | Push::Unroutable => {
                    x.stats.tx_via_socket += 1;
                    x.flush().await;
                }
            }
        }
        self.socket.push(to, datagram).await;
    }

    /// Sends what both paths queued.
    pub(crate) async fn flush(&mut self) {
        self.socket.flush().await;
        if let Some(x) = &mut self.xdp {
            x.flush().await;
        }
    }

    /// Sends that failed on either path.
    pub(crate) fn send_errors(&self) -> u64 {
        self.socket.send_errors + self.xdp.as_ref().map_or(0, |x| x.stats.send_errors)
    }

    /// When [`Underlay::handle_timeout`] has work (reading the neighbour table).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.xdp.as_ref().and_then(AfXdp::poll_timeout)
    }

    /// Runs what is due.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if let Some(x) = &mut self.xdp {
            x.handle_timeout(now);
        }
    }

    /// Brings `status` up to date: the counters in place, the rest (allocated) only when
    /// the path is not the one it shows.
    pub(crate) fn fill_status(&self, status: &mut crate::control::UnderlayStatus) {
        let path = if self.xdp.is_some() {
            "af_xdp"
        } else {
            "socket"
        };
        if status.path != path {
            *status = self.status();
        }
        if let Some(x) = &self.xdp {
            status.rx_frames = x.stats.rx_frames;
            status.tx_frames = x.stats.tx_frames;
            status.tx_via_socket = x.stats.tx_via_socket;
            status.malformed = x.stats.malformed;
        }
    }

    /// What `hyphae status` shows of the underlay.
    fn status(&self) -> crate::control::UnderlayStatus {
        match &self.xdp {
            None => crate::control::UnderlayStatus {
                path: "socket".into(),
                ..Default::default()
            },
            Some(x) => crate::control::UnderlayStatus {
                path: "af_xdp".into(),
                interface: Some(x.interface.clone()),
                xdp_mode: Some(x.xdp_mode.into()),
                zero_copy: x.zero_copy(),
                queues: x.queues(),
                rx_frames: x.stats.rx_frames,
                tx_frames: x.stats.tx_frames,
                tx_via_socket: x.stats.tx_via_socket,
                malformed: x.stats.malformed,
            },
        }
    }
}
