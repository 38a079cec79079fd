//! The underlay's UDP socket with the batching the kernel offers (via quinn-udp): receive with
//! `recvmmsg` and UDP GRO (many datagrams per system call, coalesced ones split by stride),
//! send equal-sized datagrams to one member as one UDP GSO `sendmsg`.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;

use anyhow::{Context, Result};
use quinn_udp::{RecvMeta, Transmit, UdpSocketState};
use tokio::io::Interest;
use tokio::net::UdpSocket;

use super::Datagram;

/// Messages per receive call (quinn-udp reads at most 32 with one `recvmmsg`).
const RX_MESSAGES: usize = 8;

/// One receive buffer: the most a GRO-coalesced message can hold.
const RX_BUF: usize = 65536;

/// Most payload in one GSO send: UDP's 65507-byte limit, rounded down.
const GSO_MAX_BYTES: usize = 65000;

/// Largest datagram batched with GSO: what fits a 1500-byte IPv4 underlay (1500 - 20 - 8).
/// quinn-udp sends with "don't fragment"; a segment over the path MTU fails the whole batch
/// and makes it give up GSO for good, so larger datagrams (a raised TAP `mtu`) go alone.
const GSO_MAX_SEGMENT: usize = 1472;

/// The underlay UDP socket and its batches.
pub(crate) struct Socket {
    socket: UdpSocket,
    state: UdpSocketState,
    rx: Box<[u8]>,
    meta: [RecvMeta; RX_MESSAGES],
    received: usize,
    batch: Vec<u8>,
    batch_to: Option<SocketAddr>,
    batch_segment: usize,
    batch_count: usize,
    batch_closed: bool,
    /// Sends that failed (other than for a full socket buffer, which waits).
    pub(crate) send_errors: u64,
}

impl Socket {
    /// Takes over a bound, non-blocking socket.
    pub(crate) fn new(socket: std::net::UdpSocket) -> Result<Self> {
        let socket = UdpSocket::from_std(socket).context("registering the socket")?;
        let state = UdpSocketState::new((&socket).into()).context("configuring the socket")?;
        tracing::debug!(
            gso_segments = state.max_gso_segments(),
            gro_segments = state.gro_segments(),
            "underlay offloads"
        );
        Ok(Self {
            socket,
            state,
            rx: vec![0; RX_MESSAGES * RX_BUF].into_boxed_slice(),
            meta: [RecvMeta::default(); RX_MESSAGES],
            received: 0,
            batch: Vec::with_capacity(GSO_MAX_BYTES),
            batch_to: None,
            batch_segment: 0,
            batch_count: 0,
            batch_closed: false,
            send_errors: 0,
        })
    }

    /// Waits until datagrams can be read.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        self.socket.readable().await
    }

    /// Reads one batch of messages without waiting; `Ok(false)` when there was nothing.
    pub(crate) fn try_recv(&mut self) -> io::Result<bool> {
        let mut chunks = self.rx.chunks_mut(RX_BUF);
        let mut iovs: [IoSliceMut<'_>; RX_MESSAGES] =
            std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or(&mut [])));
        let (socket, state, meta) = (&self.socket, &self.state, &mut self.meta);
        match socket.try_io(Interest::READABLE, || {
            state.recv(socket.into(), &mut iovs, meta)
        }) {
            Ok(n) => {
                self.received = n;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.received = 0;
                Ok(false)
            }
            Err(e) => {
                self.received = 0;
                Err(e)
            }
        }
    }

    /// The datagrams of the last batch, GRO-coalesced messages split at their stride.
    pub(crate) fn datagrams(&self) -> impl Iterator<Item = Datagram<'_>> {
        self.meta[..self.received]
            .iter()
            .enumerate()
            .flat_map(move |(i, meta)| {
                let buf = &self.rx[i * RX_BUF..i * RX_BUF + meta.len.min(RX_BUF)];
                buf.chunks(meta.stride.max(1)).map(move |bytes| Datagram {
                    from: meta.addr,
                    bytes,
                })
            })
    }

    /// Queues a datagram. Consecutive datagrams to one destination of one size (the last
    /// may be shorter) leave in one GSO send; anything else sends the batch first.
    pub(crate) async fn push(&mut self, to: SocketAddr, datagram: &[u8]) {
        if datagram.len() > GSO_MAX_SEGMENT {
            self.flush().await;
            self.batch_to = Some(to);
            self.batch_segment = datagram.len();
            self.batch.extend_from_slice(datagram);
            self.batch_count = 1;
            self.flush().await;
            return;
        }
        if self.batch_count > 0 {
            let joins = self.batch_to == Some(to)
                && !self.batch_closed
                && datagram.len() <= self.batch_segment
                && self.batch_count < self.state.max_gso_segments()
                && self.batch.len() + datagram.len() <= GSO_MAX_BYTES;
            if !joins {
                self.flush().await;
            }
        }
        if self.batch_count == 0 {
            self.batch_to = Some(to);
            self.batch_segment = datagram.len();
        }
        self.batch.extend_from_slice(datagram);
        self.batch_count += 1;
        // GSO: only the last segment may be shorter than the segment size.
        self.batch_closed = datagram.len() < self.batch_segment;
    }

    /// Where the queued batch goes, if one is queued.
    pub(crate) fn pending_to(&self) -> Option<SocketAddr> {
        self.batch_to
    }

    /// Sends the queued batch, waiting while the socket buffer is full.
    pub(crate) async fn flush(&mut self) {
        let Some(destination) = self.batch_to.take() else {
            return;
        };
        let transmit = Transmit {
            destination,
            ecn: None,
            contents: &self.batch,
            segment_size: (self.batch_count > 1).then_some(self.batch_segment),
            src_ip: None,
        };
        loop {
            let (socket, state) = (&self.socket, &self.state);
            match socket.try_io(Interest::WRITABLE, || {
                state.try_send(socket.into(), &transmit)
            }) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.socket.writable().await.is_err() {
                        self.send_errors += 1;
                        break;
                    }
                }
                Err(e) => {
                    self.send_errors += 1;
                    tracing::debug!(to = %destination, error = %e, "underlay send failed");
                    break;
                }
            }
        }
        self.batch.clear();
        self.batch_count = 0;
        self.batch_closed = false;
    }
}
