//! `IoRing`: the disk tier's io_uring, driven by one dedicated thread.
//!
//! Callers (any thread) send an op over a channel, ring an eventfd and block on
//! its reply; the ring thread submits everything queued, sleeps in
//! `io_uring_enter` until a completion arrives (no spinning: the machine may
//! have 2 cores), and replies. Many callers = many ops in flight = queue depth.
//! The eventfd is polled by the ring itself, so a new op wakes the sleeping
//! thread at once: without it, an op sent while others were in flight waited
//! for the next completion, and a caller's op was never in flight while it
//! did its own CPU work, so the disk saw less than the callers' depth. Short transfers
//! are resubmitted for the remainder. When io_uring cannot be set up (old
//! kernel, seccomp), ops fall back to pread/pwrite on the caller's thread.
//!
//! A caller's buffer belongs to the kernel from the moment the kernel consumes
//! the op's SQE until the op's completion (CQE) is reaped, so a caller is
//! answered from that CQE and from nothing else. Which SQEs the kernel took is
//! read from the SQ head after each `io_uring_enter`; the ones it did not take
//! stay queued, in order, for the next call. A failed call never answers the
//! ops the kernel took: EINTR is retried at once, EAGAIN and EBUSY (no room
//! for now) reap what completed and retry after a short backoff. Any other
//! error shuts the ring down: nothing is submitted again, so the SQEs the
//! kernel has not taken never reach it and their ops go back to their callers
//! unperformed (as do queued and later ops), who run them with pread/pwrite;
//! the thread keeps reaping until the kernel has completed every op it took,
//! and only then exits.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::{opcode, types, EnterFlags, IoUring};
use parking_lot::Mutex;

#[cfg(test)]
mod tests;

const RING_ENTRIES: u32 = 64;

/// `user_data` of the poll on the wake eventfd (op ids count up from 1).
const WAKE_ID: u64 = u64::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Read,
    Write,
    DataSync,
}

/// One caller's op. Dropping it unanswered hands it back to the caller
/// unperformed (its reply channel closes), which the ring does only with ops
/// the kernel never saw.
struct IoOp {
    kind: OpKind,
    offset: u64,
    /// Address of the caller's buffer, which outlives the op (the caller blocks on `done`).
    addr: usize,
    len: usize,
    done: mpsc::SyncSender<io::Result<()>>,
}

/// How the ring thread enters the kernel: [`KernelEnter`] here; tests wrap it
/// to make calls fail on cue.
trait Enter: Send + 'static {
    /// `io_uring_enter`: submit the SQEs waiting in the SQ (`pending`: their
    /// ids, oldest first; may be empty) and wait for at least one completion.
    /// Ok is the number of SQEs the kernel consumed, as the syscall returns.
    fn enter(&mut self, ring: &IoUring, pending: &[u64]) -> io::Result<usize>;
}

/// The real `io_uring_enter`.
struct KernelEnter;

impl Enter for KernelEnter {
    fn enter(&mut self, ring: &IoUring, pending: &[u64]) -> io::Result<usize> {
        let flags = EnterFlags::GETEVENTS.bits();
        // SAFETY: every SQE in the SQ points at a buffer whose caller stays
        // blocked until the op's CQE is reaped (see `Driver`).
        unsafe {
            ring.submitter()
                .enter::<libc::sigset_t>(pending.len() as u32, 1, flags, None)
        }
    }
}

/// One file's io_uring and its driver thread.
pub struct IoRing {
    fd: RawFd,
    /// Written after each send so the ring thread wakes (None: no ring).
    wake: Option<OwnedFd>,
    tx: Mutex<Option<mpsc::Sender<IoOp>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl IoRing {
    /// Start the ring thread for `fd` (which must outlive the ring).
    pub fn new(fd: RawFd) -> Self {
        Self::start(fd, KernelEnter)
    }

    fn start(fd: RawFd, enter: impl Enter) -> Self {
        let ring = match IoUring::new(RING_ENTRIES) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!("io_uring unavailable ({e}); disk tier falls back to pread/pwrite");
                None
            }
        };
        let ring = ring.and_then(|r| match eventfd() {
            Ok(wake) => Some((r, wake)),
            Err(e) => {
                tracing::warn!("no eventfd ({e}); disk tier falls back to pread/pwrite");
                None
            }
        });
        let (tx, thread, wake) = match ring {
            Some((ring, wake)) => {
                let (tx, rx) = mpsc::channel();
                let driver = Driver::new(ring, enter, fd, wake.as_raw_fd());
                let spawned = std::thread::Builder::new()
                    .name("kvfabric-uring".into())
                    .spawn(move || driver.drive(rx));
                match spawned {
                    Ok(h) => (Some(tx), Some(h), Some(wake)),
                    Err(e) => {
                        tracing::warn!("cannot start io_uring thread ({e}); using pread/pwrite");
                        (None, None, None)
                    }
                }
            }
            None => (None, None, None),
        };
        IoRing {
            fd,
            wake,
            tx: Mutex::new(tx),
            thread: Mutex::new(thread),
        }
    }

    /// Read exactly `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.submit(OpKind::Read, offset, buf.as_mut_ptr() as usize, buf.len())
    }

    /// Write all of `buf` at `offset`.
    pub fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.submit(OpKind::Write, offset, buf.as_ptr() as usize, buf.len())
    }

    /// fdatasync the file.
    pub fn datasync(&self) -> io::Result<()> {
        self.submit(OpKind::DataSync, 0, 0, 0)
    }

    fn submit(&self, kind: OpKind, offset: u64, addr: usize, len: usize) -> io::Result<()> {
        let tx = self.tx.lock().clone();
        let Some(tx) = tx else {
            return sync_op(self.fd, kind, offset, addr, len);
        };
        let (done, wait) = mpsc::sync_channel(1);
        let op = IoOp {
            kind,
            offset,
            addr,
            len,
            done,
        };
        if tx.send(op).is_err() {
            // The ring has shut down.
            return sync_op(self.fd, kind, offset, addr, len);
        }
        if let Some(wake) = &self.wake {
            // SAFETY: 8-byte write of a live u64 to an eventfd we own. A failure
            // (counter saturated) still leaves the op to the next completion.
            unsafe { libc::eventfd_write(wake.as_raw_fd(), 1) };
        }
        match wait.recv() {
            Ok(res) => res,
            // Handed back unperformed: the kernel never saw it (see `IoOp`).
            Err(_) => sync_op(self.fd, kind, offset, addr, len),
        }
    }
}

impl Drop for IoRing {
    fn drop(&mut self) {
        self.tx.lock().take();
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned by the OwnedFd.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Blocking fallback without io_uring.
fn sync_op(fd: RawFd, kind: OpKind, offset: u64, addr: usize, len: usize) -> io::Result<()> {
    let mut done = 0usize;
    if kind == OpKind::DataSync {
        // SAFETY: plain syscall on an fd the owner keeps open.
        return match unsafe { libc::fdatasync(fd) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        };
    }
    while done < len {
        let p = (addr + done) as *mut libc::c_void;
        let off = (offset + done as u64) as libc::off_t;
        // SAFETY: the caller's buffer spans [addr, addr+len) and is alive for this call.
        let n = unsafe {
            match kind {
                OpKind::Read => libc::pread(fd, p, len - done, off),
                _ => libc::pwrite(fd, p, len - done, off),
            }
        };
        match n {
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => done += n as usize,
        }
    }
    Ok(())
}

struct InFlight {
    op: IoOp,
    done_bytes: usize,
}

fn sqe(fd: RawFd, f: &InFlight, id: u64) -> io_uring::squeue::Entry {
    let addr = f.op.addr + f.done_bytes;
    let off = f.op.offset + f.done_bytes as u64;
    let len = (f.op.len - f.done_bytes).min(u32::MAX as usize) as u32;
    match f.op.kind {
        OpKind::Read => opcode::Read::new(types::Fd(fd), addr as *mut u8, len)
            .offset(off)
            .build(),
        OpKind::Write => opcode::Write::new(types::Fd(fd), addr as *const u8, len)
            .offset(off)
            .build(),
        OpKind::DataSync => opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
    }
    .user_data(id)
}

/// How long to wait before retrying a call the kernel refused for now
/// (EAGAIN, EBUSY with nothing to reap), or between looks at the CQ while
/// shutting down when even waiting fails: doubling from 50 us to 10 ms.
struct Backoff(Duration);

impl Backoff {
    const MIN: Duration = Duration::from_micros(50);
    const MAX: Duration = Duration::from_millis(10);

    fn new() -> Self {
        Backoff(Self::MIN)
    }

    fn reset(&mut self) {
        self.0 = Self::MIN;
    }

    fn wait(&mut self) {
        std::thread::sleep(self.0);
        self.0 = (self.0 * 2).min(Self::MAX);
    }
}

/// What to do after an `io_uring_enter` error.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
    )
}

/// The ring thread's state. An op is in exactly one place: `queued` (not in
/// the SQ), `ops` and `unconsumed` (its SQE waits in the SQ: the kernel will
/// take it at the next submitting call), or `ops` alone (the kernel took it:
/// its buffer is the kernel's until its CQE).
struct Driver<E: Enter> {
    ring: IoUring,
    enter: E,
    fd: RawFd,
    wake: RawFd,
    /// Ops with an SQE in the SQ or in the kernel, by `user_data`.
    ops: HashMap<u64, InFlight>,
    /// Ids of the SQEs in the SQ the kernel has not consumed, oldest first
    /// (the SQ is FIFO, so they are its tail): ops and `WAKE_ID`.
    unconsumed: VecDeque<u64>,
    /// First in, first out: ops reach the device in the order callers sent
    /// them (a stack reversed them, and reads that callers issue in file
    /// order reached the disk backwards).
    queued: VecDeque<InFlight>,
    next_id: u64,
    /// The wake poll is in the SQ or in the kernel.
    wake_armed: bool,
    /// Reused for each round's CQEs: (user_data, result).
    cqes: Vec<(u64, i32)>,
}

impl<E: Enter> Driver<E> {
    fn new(ring: IoUring, enter: E, fd: RawFd, wake: RawFd) -> Self {
        Driver {
            ring,
            enter,
            fd,
            wake,
            ops: HashMap::new(),
            unconsumed: VecDeque::new(),
            queued: VecDeque::new(),
            next_id: 0,
            wake_armed: false,
            cqes: Vec::new(),
        }
    }

    /// The thread's body: serve ops until the channel closes and every op is
    /// answered, or shut down when the kernel refuses us for good.
    fn drive(mut self, rx: mpsc::Receiver<IoOp>) {
        if let Err(e) = self.serve(&rx) {
            tracing::error!(
                "io_uring_enter failed ({e}); the disk tier's ring shuts down \
                 and its ops fall back to pread/pwrite"
            );
            self.shut_down(&rx);
        }
    }

    /// Ok when the channel has closed and every op is answered; Err with a
    /// non-transient `io_uring_enter` error.
    fn serve(&mut self, rx: &mpsc::Receiver<IoOp>) -> io::Result<()> {
        let mut open = true;
        let mut backoff = Backoff::new();
        loop {
            if self.ops.is_empty() && self.queued.is_empty() {
                if !open {
                    return Ok(());
                }
                match rx.recv() {
                    Ok(op) => self.queue(op),
                    Err(_) => return Ok(()),
                }
            }
            open &= self.take_new(rx);
            self.fill_sq();
            let refused = match self.submit_and_wait() {
                Ok(()) => false,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => false,
                Err(e) if is_transient(&e) => true,
                Err(e) => return Err(e),
            };
            // EBUSY may mean the CQ is full: reaping makes room.
            let reaped = self.reap(false);
            if !refused {
                backoff.reset();
            } else if reaped == 0 {
                backoff.wait();
            }
        }
    }

    fn queue(&mut self, op: IoOp) {
        self.queued.push_back(InFlight { op, done_bytes: 0 });
    }

    /// Queue every op waiting in the channel; false once it has closed.
    fn take_new(&mut self, rx: &mpsc::Receiver<IoOp>) -> bool {
        loop {
            match rx.try_recv() {
                Ok(op) => self.queue(op),
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// Move queued ops into the SQ (up to the ring's depth), then the wake poll.
    fn fill_sq(&mut self) {
        while self.ops.len() < RING_ENTRIES as usize {
            let Some(f) = self.queued.pop_front() else {
                break;
            };
            self.next_id += 1;
            let e = sqe(self.fd, &f, self.next_id);
            // SAFETY: the buffer of `f` stays alive until its caller gets the
            // reply, which comes only from the op's CQE (or, if the kernel never
            // consumes this SQE, after the ring has stopped submitting).
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                self.queued.push_front(f);
                break;
            }
            self.ops.insert(self.next_id, f);
            self.unconsumed.push_back(self.next_id);
        }
        if !self.wake_armed {
            let poll = opcode::PollAdd::new(types::Fd(self.wake), libc::POLLIN as u32)
                .build()
                .user_data(WAKE_ID);
            // SAFETY: the eventfd outlives the ring (IoRing joins this thread first).
            if unsafe { self.ring.submission().push(&poll) }.is_ok() {
                self.wake_armed = true;
                self.unconsumed.push_back(WAKE_ID);
            }
        }
    }

    /// Submit the SQ and wait for a completion; whatever the call returns, the
    /// SQEs the kernel consumed (the SQ head moved past them) leave `unconsumed`.
    fn submit_and_wait(&mut self) -> io::Result<()> {
        let res = self
            .enter
            .enter(&self.ring, self.unconsumed.make_contiguous());
        let left = self.ring.submission().len();
        let consumed = self.unconsumed.len().saturating_sub(left);
        if let Ok(n) = res {
            if n != consumed {
                tracing::warn!("io_uring_enter took {n} SQEs but the SQ head moved {consumed}");
            }
        }
        self.unconsumed.drain(..consumed);
        res.map(|_| ())
    }

    /// Answer the ops whose CQEs have arrived (a short transfer's rest is
    /// queued again, or, `shutting_down`, handed back); how many CQEs.
    fn reap(&mut self, shutting_down: bool) -> usize {
        self.cqes.clear();
        self.cqes
            .extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for i in 0..self.cqes.len() {
            let (id, res) = self.cqes[i];
            if id == WAKE_ID {
                // Reset the counter; the ops it announced are read at the loop's top.
                let mut n = 0;
                // SAFETY: 8-byte read into a live u64 from an eventfd we own.
                unsafe { libc::eventfd_read(self.wake, &mut n) };
                self.wake_armed = false;
                continue;
            }
            let Some(f) = self.ops.remove(&id) else {
                continue;
            };
            if let Some(rest) = complete(f, res) {
                if !shutting_down {
                    // The rest of a short transfer goes out next.
                    self.queued.push_front(rest);
                }
            }
        }
        self.cqes.len()
    }

    /// After a non-transient error: submit nothing more, hand back every op
    /// the kernel has not taken, and reap until the kernel has completed the
    /// ones it took.
    fn shut_down(&mut self, rx: &mpsc::Receiver<IoOp>) {
        // Their SQEs stay in the SQ, but no call below submits (`pending` is
        // empty) and the SQ goes with the ring when this thread ends.
        for id in self.unconsumed.drain(..) {
            self.ops.remove(&id);
        }
        self.wake_armed = false;
        self.queued.clear();
        let mut backoff = Backoff::new();
        while !self.ops.is_empty() {
            while let Ok(op) = rx.try_recv() {
                drop(op);
            }
            match self.enter.enter(&self.ring, &[]) {
                Ok(_) => backoff.reset(),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // Cannot sleep in the kernel: look at the CQ now and then
                // (completions still arrive; sleeping runs their task work).
                Err(_) => backoff.wait(),
            }
            self.reap(true);
        }
    }
}

impl<E: Enter> Drop for Driver<E> {
    fn drop(&mut self) {
        // Only a panic in the ring thread gets here with ops the kernel still
        // owns; dropping them would let their callers reuse buffers the kernel
        // is about to write, so the process stops instead.
        let kernel_owned = self
            .ops
            .keys()
            .filter(|id| !self.unconsumed.contains(id))
            .count();
        if kernel_owned > 0 {
            tracing::error!("io_uring thread died with {kernel_owned} ops in the kernel");
            std::process::abort();
        }
    }
}

/// Answer `f` from its CQE's result, or give it back when a short transfer
/// leaves a rest to do.
fn complete(mut f: InFlight, res: i32) -> Option<InFlight> {
    let reply = if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else if f.op.kind == OpKind::DataSync {
        Ok(())
    } else if res == 0 {
        Err(io::ErrorKind::UnexpectedEof.into())
    } else {
        f.done_bytes += res as usize;
        if f.done_bytes < f.op.len {
            return Some(f);
        }
        Ok(())
    };
    let _ = f.op.done.send(reply);
    None
}
