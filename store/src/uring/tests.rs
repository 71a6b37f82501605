use super::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

#[test]
fn concurrent_writes_then_reads_roundtrip() {
    let f = tempfile::tempfile().unwrap();
    f.set_len(1 << 20).unwrap();
    let ring = std::sync::Arc::new(IoRing::new(f.as_raw_fd()));
    std::thread::scope(|s| {
        for i in 0..8u8 {
            let ring = ring.clone();
            s.spawn(move || {
                let buf = vec![i; 65536];
                ring.write(i as u64 * 65536, &buf).unwrap();
            });
        }
    });
    ring.datasync().unwrap();
    for i in 0..8u8 {
        let mut buf = vec![0u8; 65536];
        ring.read(i as u64 * 65536, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == i));
    }
    // Reading past the end is an error, not silent zeros.
    let mut buf = vec![0u8; 4096];
    assert!(ring.read(2 << 20, &mut buf).is_err());
}

/// An op sent while another is in flight is submitted at once, not after
/// that one completes: a read from a socket nobody writes to yet stays in
/// flight while a write on the same socket must still go through.
#[test]
fn new_op_does_not_wait_for_the_ops_in_flight() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let ring = std::sync::Arc::new(IoRing::new(a.as_raw_fd()));
    let reader = {
        let ring = ring.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4];
            ring.read(0, &mut buf).map(|()| buf)
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(100)); // the read is in flight
    let (tx, rx) = mpsc::channel();
    {
        let ring = ring.clone();
        std::thread::spawn(move || tx.send(ring.write(0, b"ping")));
    }
    let wrote = rx.recv_timeout(std::time::Duration::from_secs(5));
    // Unblock the read whatever happened, so the ring can shut down.
    use std::io::{Read, Write};
    (&b).write_all(b"pong").unwrap();
    assert!(
        matches!(wrote, Ok(Ok(()))),
        "write waited behind the read: {wrote:?}"
    );
    let mut got = [0u8; 4];
    (&b).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    assert_eq!(&reader.join().unwrap().unwrap(), b"pong");
}

/// What one `io_uring_enter` through [`Faulty`] does.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// The real call.
    Pass,
    /// Fail with this errno before the kernel sees anything, as the kernel
    /// does for EAGAIN, EBUSY and EINTR when it took no SQE.
    Fail(i32),
    /// The kernel takes only the first `n` pending SQEs and returns without
    /// waiting, as it does when it runs short of requests.
    Take(usize),
}

#[derive(Default)]
struct Script {
    /// The next calls, in order.
    steps: VecDeque<Step>,
    /// After `steps`: Some(errno) fails every call that would submit, and
    /// waits too with `waits_fail`; None passes.
    broken: Option<i32>,
    waits_fail: bool,
    /// Every call: the ids it was asked to submit and its result (Err: errno).
    calls: Vec<(Vec<u64>, Result<usize, i32>)>,
}

impl Script {
    /// How many op SQEs (not wake polls) the kernel has taken.
    fn ops_taken(&self) -> usize {
        self.calls
            .iter()
            .filter_map(|(ids, r)| Some(&ids[..*r.as_ref().ok()?]))
            .flatten()
            .filter(|&&id| id != WAKE_ID)
            .count()
    }
}

/// The real `io_uring_enter`, failing on cue.
struct Faulty(Arc<Mutex<Script>>);

impl Enter for Faulty {
    fn enter(&mut self, ring: &IoUring, pending: &[u64]) -> io::Result<usize> {
        let step = {
            let mut s = self.0.lock();
            match (s.steps.pop_front(), s.broken) {
                (Some(step), _) => step,
                (None, Some(errno)) if !pending.is_empty() || s.waits_fail => Step::Fail(errno),
                (None, _) => Step::Pass,
            }
        };
        let take = match step {
            Step::Pass => pending.len(),
            Step::Take(n) => n.min(pending.len()),
            Step::Fail(errno) => {
                self.0.lock().calls.push((pending.to_vec(), Err(errno)));
                return Err(io::Error::from_raw_os_error(errno));
            }
        };
        // Submit, log what the kernel took (before waiting, so a test can see
        // ops in flight), then wait as the real call would.
        // SAFETY: as in KernelEnter: the driver keeps these buffers alive.
        let res = unsafe {
            ring.submitter()
                .enter::<libc::sigset_t>(take as u32, 0, 0, None)
        };
        let logged = match &res {
            Ok(n) => Ok(*n),
            Err(e) => Err(e.raw_os_error().unwrap_or(0)),
        };
        self.0.lock().calls.push((pending.to_vec(), logged));
        let taken = res?;
        if matches!(step, Step::Pass) {
            match KernelEnter.enter(ring, &[]) {
                Err(e) if taken == 0 => return Err(e),
                _ => {}
            }
        }
        Ok(taken)
    }
}

/// EAGAIN, EBUSY, EINTR and short submits while writes and reads are in
/// flight: every op is retried and completes with the right bytes, through
/// the ring (the old driver failed every op in flight on EAGAIN).
#[test]
fn transient_enter_failures_are_retried_and_every_op_completes() {
    use Step::*;
    let f = tempfile::tempfile().unwrap();
    f.set_len(1 << 20).unwrap();
    let script = Arc::new(Mutex::new(Script::default()));
    script.lock().steps = [
        Fail(libc::EAGAIN),
        Take(1),
        Fail(libc::EBUSY),
        Take(2),
        Fail(libc::EINTR),
        Fail(libc::EAGAIN),
        Take(1),
        Fail(libc::EBUSY),
        Pass,
        Fail(libc::EAGAIN),
    ]
    .into();
    let ring = IoRing::start(f.as_raw_fd(), Faulty(script.clone()));
    std::thread::scope(|s| {
        for i in 0..8u8 {
            let ring = &ring;
            s.spawn(move || ring.write(i as u64 * 65536, &vec![i + 1; 65536]).unwrap());
        }
    });
    ring.datasync().unwrap();
    std::thread::scope(|s| {
        for i in 0..8u8 {
            let ring = &ring;
            s.spawn(move || {
                let mut buf = vec![0u8; 65536];
                ring.read(i as u64 * 65536, &mut buf).unwrap();
                assert!(buf.iter().all(|&b| b == i + 1), "block {i}");
            });
        }
    });
    let s = script.lock();
    assert!(s.steps.is_empty(), "not every failure was injected");
    // 8 writes, the sync and 8 reads, each taken by the kernel (an op handed
    // back to pread/pwrite would also give the right bytes).
    assert!(
        s.ops_taken() >= 17,
        "only {} ops reached the kernel",
        s.ops_taken()
    );
}

/// What a reader saw: its read's result (with the buffer) and whether the
/// data had been sent when the answer came.
type Answer = (std::io::Result<[u8; 8]>, bool);

/// What a reused buffer is filled with.
const SENTINEL: u8 = 0xAA;

/// A reader thread of [`permanent_failure_waits_for_the_kernel`]: reads 8
/// bytes through the ring, reports the answer, then reuses its buffer
/// (fills it with `SENTINEL`) and, between two `reused` waits, checks that
/// nothing wrote into it after the answer.
fn spawn_reader(
    ring: Arc<IoRing>,
    data_sent: Arc<AtomicBool>,
    reused: Arc<Barrier>,
    done_tx: mpsc::Sender<Answer>,
    check_tx: mpsc::Sender<bool>,
) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8];
        let res = ring.read(0, &mut buf);
        let after_data = data_sent.load(Ordering::SeqCst);
        done_tx.send((res.map(|()| buf), after_data)).unwrap();
        // The caller reuses its buffer: nothing may write into it now.
        for b in buf.iter_mut() {
            // SAFETY: a live byte of our own buffer (volatile: the kernel
            // is the writer this checks for).
            unsafe { std::ptr::write_volatile(b, SENTINEL) };
        }
        reused.wait();
        reused.wait();
        // SAFETY: as above.
        let kept = buf
            .iter()
            .all(|b| unsafe { std::ptr::read_volatile(b) } == SENTINEL);
        check_tx.send(kept).unwrap();
    });
}

/// A permanent `io_uring_enter` failure while reads are in the kernel: no
/// read is answered before the kernel completes it, no buffer is written
/// after its answer, the op the kernel never took is handed back at once,
/// nothing is submitted after the failure, and the ring shuts down once the
/// kernel has completed all it took. `waits_fail`: waiting fails too, so the
/// ring must poll its CQ.
fn permanent_failure_waits_for_the_kernel(waits_fail: bool) {
    let secs = Duration::from_secs;
    let (a, b) = UnixStream::pair().unwrap();
    let script = Arc::new(Mutex::new(Script::default()));
    let ring = Arc::new(IoRing::start(a.as_raw_fd(), Faulty(script.clone())));
    let data_sent = Arc::new(AtomicBool::new(false));
    let reused = Arc::new(Barrier::new(4));
    let (done_tx, done_rx) = mpsc::channel();
    let (check_tx, check_rx) = mpsc::channel();
    for _ in 0..3 {
        let (ring, data_sent, reused) = (ring.clone(), data_sent.clone(), reused.clone());
        spawn_reader(ring, data_sent, reused, done_tx.clone(), check_tx.clone());
    }
    let deadline = Instant::now() + secs(10);
    while script.lock().ops_taken() < 3 {
        assert!(
            Instant::now() < deadline,
            "the reads never reached the kernel"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    {
        let mut s = script.lock();
        s.broken = Some(libc::ENXIO);
        s.waits_fail = waits_fail;
    }
    // A fourth read wakes the ring, whose next call fails: that read was never
    // taken, so it comes back at once and runs as a pread (ESPIPE on a socket).
    let (late_tx, late_rx) = mpsc::channel();
    {
        let ring = ring.clone();
        std::thread::spawn(move || late_tx.send(ring.read(0, &mut [0u8; 8])));
    }
    let late = late_rx
        .recv_timeout(secs(10))
        .expect("the untaken read came back");
    let early = done_rx.recv_timeout(Duration::from_millis(300));
    assert!(early.is_err(), "answered before its completion: {early:?}");
    assert_eq!(
        late.err().and_then(|e| e.raw_os_error()),
        Some(libc::ESPIPE)
    );

    data_sent.store(true, Ordering::SeqCst);
    (&b).write_all(&[[1u8; 8], [2; 8], [3; 8]].concat())
        .unwrap();
    let mut got: Vec<[u8; 8]> = (0..3)
        .map(|_| {
            let (res, after_data) = done_rx.recv_timeout(secs(10)).expect("a read completed");
            assert!(after_data, "answered before its data arrived");
            res.expect("the kernel's read")
        })
        .collect();
    got.sort();
    assert_eq!(got, [[1u8; 8], [2; 8], [3; 8]]);

    // With the buffers reused, bytes sent now must stay in the socket.
    reused.wait();
    (&b).write_all(&[9u8; 24]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    reused.wait();
    for _ in 0..3 {
        assert!(
            check_rx.recv_timeout(secs(10)).unwrap(),
            "a buffer was written after its answer"
        );
    }
    a.set_read_timeout(Some(secs(5))).unwrap();
    let mut rest = [0u8; 24];
    (&a).read_exact(&mut rest).unwrap();
    assert_eq!(rest, [9u8; 24]);

    // Shut down: later ops run as pwrite, and nothing was submitted after the failure.
    let late = ring.write(0, b"late").err().and_then(|e| e.raw_os_error());
    assert_eq!(late, Some(libc::ESPIPE));
    let s = script.lock();
    let failed = s.calls.iter().position(|(_, r)| *r == Err(libc::ENXIO));
    let failed = failed.expect("the failure was injected");
    assert!(
        s.calls[failed + 1..].iter().all(|(ids, _)| ids.is_empty()),
        "submitted after the failure"
    );
    drop(s);
    drop(ring); // joins the thread, which has exited
}

#[test]
fn permanent_enter_failure_waits_for_the_ops_in_the_kernel() {
    permanent_failure_waits_for_the_kernel(false);
}

#[test]
fn permanent_failure_polls_the_cq_when_waits_fail_too() {
    permanent_failure_waits_for_the_kernel(true);
}

/// The ring's read and write throughput for 1.5 MiB blocks from 8
/// threads against fio (io_uring, O_DIRECT, same block size and depth)
/// on the same file, alternated 3 times (ignored probe; the file goes in
/// $TMPDIR): `cargo test --release -p kvfabric-store perf_ring -- --ignored --nocapture`.
/// `PERF_CLIENTS` sets the ring's client threads (default: fio's depth, 8);
/// `PERF_BUFFERS` the buffers each client cycles through (default 1, as
/// fio does; 4 spreads the I/O over 48 MiB, as direct I/O from the RAM
/// arena would, and runs 10-25% slower on the reference VM: see `staging`).
#[test]
#[ignore]
fn perf_ring_vs_fio() {
    use crate::disk_staging::AlignedBuf;
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::Instant;
    const BLOCK: usize = 3 << 19;
    const BLOCKS: usize = 512;
    const DEPTH: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring.data");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    f.set_len((BLOCK * BLOCKS) as u64).unwrap();
    let ring = IoRing::new(f.as_raw_fd());
    let fio = |rw: &str| {
        let o = std::process::Command::new("fio")
            .args([
                "--name=p",
                &format!("--filename={}", path.display()),
                &format!("--size={}", BLOCK * BLOCKS),
                &format!("--bs={BLOCK}"),
                &format!("--iodepth={DEPTH}"),
                "--ioengine=io_uring",
                "--direct=1",
                &format!("--rw={rw}"),
                "--output-format=terse",
                "--terse-version=3",
            ])
            .output()
            .unwrap();
        // terse v3: field 7 is read bandwidth KiB/s, field 48 write bandwidth KiB/s.
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let fields: Vec<&str> = out.trim().split(';').collect();
        let kib: f64 = fields[if rw == "read" { 6 } else { 47 }]
            .parse()
            .unwrap_or(0.0);
        kib * 1024.0 / 1e9
    };
    let env_or = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let clients = env_or("PERF_CLIENTS", DEPTH);
    let per_client = env_or("PERF_BUFFERS", 1).max(1);
    let ours = |write: bool| {
        let t = Instant::now();
        std::thread::scope(|s| {
            for c in 0..clients {
                let ring = &ring;
                s.spawn(move || {
                    let mut bufs: Vec<AlignedBuf> =
                        (0..per_client).map(|_| AlignedBuf::new(BLOCK)).collect();
                    for (n, i) in (c..BLOCKS).step_by(clients).enumerate() {
                        let off = (i * BLOCK) as u64;
                        let buf = &mut bufs[n % per_client];
                        if write {
                            buf.as_mut_slice()[0] = i as u8;
                            ring.write(off, buf.as_slice()).unwrap();
                        } else {
                            ring.read(off, buf.as_mut_slice()).unwrap();
                        }
                    }
                });
            }
        });
        (BLOCK * BLOCKS) as f64 / t.elapsed().as_secs_f64() / 1e9
    };
    ours(true);
    for _ in 0..3 {
        let (fw, ow, fr, or) = (fio("write"), ours(true), fio("read"), ours(false));
        println!(
            "write: fio {fw:.2} ring {ow:.2} GB/s ({:.2}); read: fio {fr:.2} ring {or:.2} GB/s ({:.2})",
            ow / fw,
            or / fr
        );
    }
}
