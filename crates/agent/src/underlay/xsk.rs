//! One AF_XDP socket (Linux 4.18): its UMEM of fixed-size frames and its four rings,
//! driven in batches. Receive: the kernel fills frames we gave it on the fill ring and
//! hands them back on the rx ring; we return them to the fill ring once the data path has
//! read them. Send: we write a frame from the free pool, put it on the tx ring, kick the
//! kernel with `sendto`, and take the frame back from the completion ring.
//!
//! The rings are single-producer, single-consumer queues shared with the kernel: the
//! producer index is published with Release after the entries are written, the other
//! side's index read with Acquire before entries are read (Documentation/networking/
//! af_xdp.rst, "Rings").

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;

/// Size of one UMEM frame: the smallest chunk the kernel takes, and more than a
/// 1500-byte-MTU frame plus the 256 bytes of headroom copy mode leaves before the data.
pub(crate) const FRAME_SIZE: usize = 2048;

/// Frames per socket: 4 MiB of UMEM, half of them on the fill ring, half for sending.
const FRAMES: usize = 2048;

/// Entries of each ring (a power of two).
const RING_SIZE: u32 = 1024;

/// Descriptors read from the rx ring per call.
pub(crate) const RX_BATCH: usize = 64;

/// `sendto` kicks per flush: copy mode sends at most 32 frames per call (the kernel's
/// TX_BATCH_SIZE), so a full ring takes 32 kicks; the rest waits for the next flush.
const MAX_KICKS: usize = 64;

/// An anonymous or ring mapping, unmapped on drop.
struct Mmap {
    ptr: *mut u8,
    len: usize,
}

impl Mmap {
    fn new(fd: Option<RawFd>, len: usize, offset: libc::off_t) -> io::Result<Self> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
            ),
        };
        // SAFETY: a fresh mapping of `len` bytes; the kernel checks fd and offset.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }
}

// SAFETY: the mapping is owned by this value alone (nothing else holds its pointer), so
// it may move to another thread with it; the agent moves its workers' underlays into the
// threads that run them.
unsafe impl Send for Mmap {}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr and len are what mmap returned; nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One ring: `T` is `u64` (fill, completion: frame addresses) or `xdp_desc` (rx, tx).
struct Ring<T> {
    map: Mmap,
    producer: usize,
    consumer: usize,
    desc: usize,
    /// Our side's index: the producer's for fill and tx, the consumer's for rx and
    /// completion.
    local: u32,
    _entry: std::marker::PhantomData<T>,
}

impl<T: Copy> Ring<T> {
    /// Maps a ring; `producer`: we write it (fill, tx), else we read it (rx, completion).
    fn map(fd: RawFd, off: &libc::xdp_ring_offset, pgoff: u64, producer: bool) -> io::Result<Self> {
        let len = off.desc as usize + RING_SIZE as usize * std::mem::size_of::<T>();
        let map = Mmap::new(Some(fd), len, pgoff as libc::off_t)?;
        let mut ring = Self {
            map,
            producer: off.producer as usize,
            consumer: off.consumer as usize,
            desc: off.desc as usize,
            local: 0,
            _entry: std::marker::PhantomData,
        };
        // Our index starts where the kernel's view of our side is (0 on a new socket).
        let ours = if producer {
            ring.producer
        } else {
            ring.consumer
        };
        ring.local = ring.index(ours).load(Ordering::Relaxed);
        Ok(ring)
    }

    fn index(&self, at: usize) -> &AtomicU32 {
        // SAFETY: the kernel places the producer and consumer u32s, 4-byte aligned, inside
        // the mapping at the offsets it reported; both sides only touch them atomically.
        unsafe { &*self.map.ptr.add(at).cast::<AtomicU32>() }
    }

    fn slot(&self, i: u32) -> *mut T {
        // SAFETY: (i & mask) < RING_SIZE entries, all inside the mapping (see `map`).
        unsafe {
            self.map
                .ptr
                .add(self.desc)
                .cast::<T>()
                .add((i & (RING_SIZE - 1)) as usize)
        }
    }

    /// Producer: entries we may write now.
    fn free(&self) -> u32 {
        RING_SIZE
            - self
                .local
                .wrapping_sub(self.index(self.consumer).load(Ordering::Acquire))
    }

    /// Producer: writes one entry (after `free` said there is room); published later.
    fn push(&mut self, v: T) {
        // SAFETY: the slot is ours until published: the kernel consumed it (`free`).
        unsafe { self.slot(self.local).write(v) };
        self.local = self.local.wrapping_add(1);
    }

    /// Producer: hands the written entries to the kernel.
    fn publish(&self) {
        self.index(self.producer)
            .store(self.local, Ordering::Release);
    }

    /// Producer: entries published that the kernel has not consumed yet.
    fn unconsumed(&self) -> u32 {
        self.local
            .wrapping_sub(self.index(self.consumer).load(Ordering::Acquire))
    }

    /// Consumer: entries ready to read.
    fn available(&self) -> u32 {
        self.index(self.producer)
            .load(Ordering::Acquire)
            .wrapping_sub(self.local)
    }

    /// Consumer: reads one entry (after `available` said there is one).
    fn pop(&mut self) -> T {
        // SAFETY: the kernel published this slot (Acquire in `available`).
        let v = unsafe { self.slot(self.local).read() };
        self.local = self.local.wrapping_add(1);
        v
    }

    /// Consumer: gives the read slots back to the kernel.
    fn release(&self) {
        self.index(self.consumer)
            .store(self.local, Ordering::Release);
    }
}

/// A received frame in the UMEM, owned by us until [`Xsk::recycle`].
#[derive(Clone, Copy)]
pub(crate) struct RxFrame {
    addr: u64,
    len: u32,
}

/// One AF_XDP socket bound to one receive queue, with its own UMEM.
pub(crate) struct Xsk {
    fd: AsyncFd<OwnedFd>,
    umem: Mmap,
    fill: Ring<u64>,
    completion: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    /// Frames free for sending.
    free: Vec<u64>,
    /// Received frames the data path is reading; back to the fill ring on `recycle`.
    held: Vec<u64>,
    /// The driver moves frames in and out of the UMEM itself (no copy).
    pub(crate) zero_copy: bool,
}

fn setsockopt<T>(fd: RawFd, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: value points to a live T of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Xsk {
    /// A socket on `queue` of interface `ifindex`: zero-copy if `try_zero_copy` and the
    /// driver can, copy mode otherwise.
    pub(crate) fn open(ifindex: u32, queue: u32, try_zero_copy: bool) -> io::Result<Self> {
        // SAFETY: socket(2) with constant arguments.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned by the kernel, owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem = Mmap::new(None, FRAMES * FRAME_SIZE, 0)?;
        // SAFETY: xdp_umem_reg is plain integers; all zero is valid.
        let mut reg: libc::xdp_umem_reg = unsafe { std::mem::zeroed() };
        reg.addr = umem.ptr as u64;
        reg.len = umem.len as u64;
        reg.chunk_size = FRAME_SIZE as u32;
        setsockopt(raw, libc::XDP_UMEM_REG, &reg)?;
        for ring in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
            libc::XDP_TX_RING,
        ] {
            setsockopt(raw, ring, &(RING_SIZE as libc::c_int))?;
        }
        // SAFETY: xdp_mmap_offsets is plain integers.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: off and len are live and sized as passed.
        let r = unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fill = Ring::<u64>::map(raw, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING, true)?;
        let completion =
            Ring::<u64>::map(raw, &off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING, false)?;
        let rx = Ring::map(raw, &off.rx, libc::XDP_PGOFF_RX_RING as u64, false)?;
        let tx = Ring::map(raw, &off.tx, libc::XDP_PGOFF_TX_RING as u64, true)?;
        let addrs = (0..FRAMES as u64).map(|i| i * FRAME_SIZE as u64);
        let mut free: Vec<u64> = Vec::with_capacity(FRAMES);
        for addr in addrs {
            if fill.free() > 0 && free.len() >= FRAMES / 2 {
                fill.push(addr);
            } else {
                free.push(addr);
            }
        }
        fill.publish();
        let bind = |flags: u16| {
            // SAFETY: sockaddr_xdp is plain integers.
            let mut sa: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
            sa.sxdp_family = libc::AF_XDP as u16;
            sa.sxdp_flags = flags;
            sa.sxdp_ifindex = ifindex;
            sa.sxdp_queue_id = queue;
            // SAFETY: sa is live and sized as passed.
            let r = unsafe {
                libc::bind(
                    raw,
                    (&sa as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        let zero_copy = try_zero_copy && bind(libc::XDP_ZEROCOPY).is_ok();
        if !zero_copy {
            bind(libc::XDP_COPY)?;
        }
        // SAFETY: an OwnedFd's descriptor stays open and the same until the AsyncFd drops.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Self {
            fd,
            umem,
            fill,
            completion,
            rx,
            tx,
            free,
            held: Vec::with_capacity(RX_BATCH),
            zero_copy,
        })
    }

    /// The socket's descriptor, for the XSKMAP.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.get_ref().as_raw_fd()
    }

    /// Ready when the rx ring holds frames.
    pub(crate) fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut guard)) => {
                    if self.rx.available() > 0 {
                        // The guard drops with its readiness kept: the caller drains.
                        return Poll::Ready(Ok(()));
                    }
                    guard.clear_ready();
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Gives the frames of the last receive back to the kernel's fill ring.
    pub(crate) fn recycle(&mut self) {
        if self.held.is_empty() {
            return;
        }
        // The fill ring has room for every frame: there are no more frames than entries
        // outside the free pool.
        for addr in self.held.drain(..) {
            if self.fill.free() == 0 {
                self.free.push(addr);
                continue;
            }
            self.fill.push(addr);
        }
        self.fill.publish();
    }

    /// Takes up to [`RX_BATCH`] received frames into `out`; they stay ours until
    /// [`Xsk::recycle`].
    pub(crate) fn recv(&mut self, out: &mut Vec<RxFrame>) -> usize {
        let n = (self.rx.available() as usize).min(RX_BATCH);
        for _ in 0..n {
            let d = self.rx.pop();
            self.held.push(d.addr & !(FRAME_SIZE as u64 - 1));
            out.push(RxFrame {
                addr: d.addr,
                len: d.len,
            });
        }
        if n > 0 {
            self.rx.release();
        }
        n
    }

    /// The bytes of a received frame (empty if the kernel's descriptor was out of bounds).
    pub(crate) fn frame(&self, f: RxFrame) -> &[u8] {
        let (start, len) = (f.addr as usize, f.len as usize);
        if start.checked_add(len).is_none_or(|end| end > self.umem.len) {
            return &[];
        }
        // SAFETY: in bounds (checked), and the frame is ours until `recycle`: the kernel
        // does not write a frame that is on neither the fill nor the rx ring.
        unsafe { std::slice::from_raw_parts(self.umem.ptr.add(start), len) }
    }

    /// Writes one frame with `emit` (given the frame's buffer, returns the length) and
    /// queues it on the tx ring; `false` when no frame or ring slot is free.
    pub(crate) fn queue(&mut self, emit: impl FnOnce(&mut [u8]) -> Option<usize>) -> bool {
        if self.free.is_empty() {
            self.reclaim();
        }
        if self.tx.free() == 0 {
            return false;
        }
        let Some(addr) = self.free.pop() else {
            return false;
        };
        // SAFETY: the frame came from the free pool: on no ring, so only we touch it;
        // FRAME_SIZE bytes from addr are inside the UMEM (addresses are frame-aligned).
        let buf =
            unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(addr as usize), FRAME_SIZE) };
        match emit(buf) {
            Some(len) => {
                self.tx.push(libc::xdp_desc {
                    addr,
                    len: len as u32,
                    options: 0,
                });
                true
            }
            None => {
                self.free.push(addr);
                false
            }
        }
    }

    /// Takes sent frames back from the completion ring.
    fn reclaim(&mut self) {
        let n = self.completion.available();
        for _ in 0..n {
            let addr = self.completion.pop();
            self.free.push(addr & !(FRAME_SIZE as u64 - 1));
        }
        if n > 0 {
            self.completion.release();
        }
    }

    /// Publishes the queued frames and kicks the kernel until it took them (or is busy);
    /// returns the send errors other than "try again".
    pub(crate) async fn flush(&mut self) -> u64 {
        self.tx.publish();
        let mut errors = 0;
        for _ in 0..MAX_KICKS {
            self.reclaim();
            if self.tx.unconsumed() == 0 {
                break;
            }
            // SAFETY: sendto with no buffer on our own socket: the AF_XDP "kick".
            let r = unsafe {
                libc::sendto(
                    self.raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r >= 0 {
                continue;
            }
            match io::Error::last_os_error().raw_os_error() {
                // Budget used up (EAGAIN) or the device queue full: go on after others ran.
                Some(libc::EAGAIN) => {}
                Some(libc::EBUSY) | Some(libc::ENOBUFS) => tokio::task::yield_now().await,
                _ => {
                    errors += 1;
                    break;
                }
            }
        }
        self.reclaim();
        errors
    }
}
