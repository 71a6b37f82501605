//! A small thread pool for data-parallel kernels: spins briefly, then parks.
//!
//! `run(tasks, f)` calls `f(i)` for every `i < tasks` on the caller plus the
//! workers, and returns when all are done. A decode step runs ~150 short jobs
//! back to back, so waking a parked thread (a futex round trip, ~15 us) for
//! each would cost more than the work: between jobs a worker watches for the
//! next one for a short bounded time ([`SPIN`]) and only then blocks on a
//! condition variable. The caller waits only for workers that joined the
//! job (a parked or preempted worker that has not yet is shut out when the
//! caller finishes its share), spinning briefly and then parking too.
//! Nothing spins unbounded, so a busy machine (cores shared with other
//! processes) costs at most one short spin window per idle period. Which
//! thread runs which task never changes a result: the kernels only split
//! independent outputs, never a reduction.
//!
//! Tasks are handed out in contiguous lanes, one per thread ([`Lane`]): each
//! thread takes its own lane's tasks in order and, once it is empty, takes
//! the others' from their far end. Neighbouring tasks often read the same
//! cache lines (the two half tiles of a weight tile share every line, the KV
//! heads of a token are one span): one shared counter dealt them out to the
//! threads alternately, so every core fetched every line.
//!
//! A worker copies the job out under the state lock and runs it outside,
//! so every thread computes at once. A panic in a task does not strand the
//! pool: each thread catches its own, the caller still waits until no worker
//! is inside the job (they may be running the closure it borrowed), then
//! re-raises the first panic (its own first, else a worker's). The workers
//! live on, so the pool stays usable.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle thread keeps watching for work before it parks. A
/// decode step's jobs follow each other within a few microseconds; longer
/// gaps (between steps) park. Spinning never yields: under load, `yield_now`
/// hands the rest of the time slice to other processes (milliseconds).
const SPIN: Duration = Duration::from_micros(40);

/// The job being run: a lifetime-erased pointer to the caller's closure.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
}

// SAFETY: the pointee is `Sync` and outlives the job (run() waits for every
// worker to finish with it before returning or unwinding).
unsafe impl Send for Job {}

struct State {
    job: Option<Job>,
    /// Workers blocked (or about to block) on `wake`.
    sleeping: usize,
    /// The caller is blocked (or about to block) on `done`.
    caller_waiting: bool,
    /// The first panic of a worker's share in the current job.
    panic: Option<Box<dyn Any + Send>>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    done: Condvar,
    /// Job control word: generation (high 32 bits, bumped under `state` once
    /// per job), [`CLOSED`], and the number of workers inside the job (low bits).
    ctl: AtomicU64,
    shutdown: AtomicBool,
    /// One lane of tasks per thread (the caller's is lane 0).
    lanes: Box<[Lane]>,
}

/// A contiguous range of task indices, taken from the front by its owner and
/// from the back by the other threads: `front << 32 | back`, empty when
/// `front >= back`. Padded to a cache line so owners do not share one.
#[repr(align(64))]
struct Lane(AtomicU64);

impl Lane {
    fn set(&self, front: usize, back: usize) {
        self.0
            .store(((front as u64) << 32) | back as u64, Ordering::Relaxed);
    }

    /// The next task from the front (`owner`) or the back; None when empty.
    fn take(&self, owner: bool) -> Option<usize> {
        let mut v = self.0.load(Ordering::Relaxed);
        loop {
            let (front, back) = (v >> 32, v & u32::MAX as u64);
            if front >= back {
                return None;
            }
            let (new, task) = if owner {
                (v + (1 << 32), front)
            } else {
                (v - 1, back - 1)
            };
            match self
                .0
                .compare_exchange_weak(v, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(task as usize),
                Err(now) => v = now,
            }
        }
    }
}

/// Set in `ctl` once the caller has finished its share: no worker joins after.
const CLOSED: u64 = 1 << 31;
const ACTIVE: u64 = CLOSED - 1;

/// A fixed set of worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes concurrent callers (the pool runs one job at a time).
    caller: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadPool({} threads)", self.threads())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic inside a kernel task poisons nothing we rely on: recover the guard.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Watch `done()` for at most [`SPIN`]; true if it became true.
fn spin_until(done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..16 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() > SPIN {
            return done();
        }
    }
}

impl ThreadPool {
    /// A pool using `threads` threads in total (the caller counts as one).
    pub fn new(threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                job: None,
                sleeping: 0,
                caller_waiting: false,
                panic: None,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
            ctl: AtomicU64::new(CLOSED),
            shutdown: AtomicBool::new(false),
            lanes: (0..threads.max(1))
                .map(|_| Lane(AtomicU64::new(0)))
                .collect(),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("kvf-kernel-{i}"))
                    .spawn(move || worker(s, i))
                    .expect("spawning a kernel thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            caller: Mutex::new(()),
        }
    }

    /// Total threads (workers + caller).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run `f(0..tasks)` in parallel; returns when every call has returned.
    /// A panic in `f` reaches the caller once no thread runs `f` any more
    /// (tasks not yet started when it happened may not run).
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        if tasks == 1 || self.workers.is_empty() {
            (0..tasks).for_each(f);
            return;
        }
        assert!(
            tasks < 1 << 32,
            "ThreadPool::run takes fewer than 2^32 tasks"
        );
        let _one_job = lock(&self.caller);
        let s = &*self.shared;
        // SAFETY: erase the lifetime; we wait below until no worker holds it.
        let f_static: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        // Lanes are published by the SeqCst store of the new generation below.
        let lanes = s.lanes.len();
        for (j, lane) in s.lanes.iter().enumerate() {
            lane.set(tasks * j / lanes, tasks * (j + 1) / lanes);
        }
        let wake = {
            let mut st = lock(&s.state);
            st.job = Some(Job { f: f_static });
            let generation = (s.ctl.load(Ordering::SeqCst) >> 32) + 1;
            s.ctl.store(generation << 32, Ordering::SeqCst);
            st.sleeping > 0
        };
        if wake {
            s.wake.notify_all();
        }
        let own = catch_unwind(AssertUnwindSafe(|| drain(&s.lanes, 0, f)));
        // Even when unwinding: the workers may still be running `f`.
        close_and_wait(s);
        let worker_panic = {
            let mut st = lock(&s.state);
            st.job = None;
            st.panic.take()
        };
        if let Err(payload) = own {
            resume_unwind(payload);
        }
        if let Some(payload) = worker_panic {
            resume_unwind(payload);
        }
    }
}

/// Close the current job and wait until no worker is inside it: a worker that
/// has not joined yet (parked, or preempted by another process) never will,
/// and is not waited for.
fn close_and_wait(s: &Shared) {
    let active = s.ctl.fetch_or(CLOSED, Ordering::SeqCst) & ACTIVE;
    let finished = || s.ctl.load(Ordering::SeqCst) & ACTIVE == 0;
    if active > 0 && !spin_until(finished) {
        let mut st = lock(&s.state);
        st.caller_waiting = true;
        while !finished() {
            st = s.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.caller_waiting = false;
    }
}

/// Run the tasks of lane `own` in order, then the other lanes' from their ends.
fn drain(lanes: &[Lane], own: usize, f: &(dyn Fn(usize) + Sync)) {
    while let Some(i) = lanes[own].take(true) {
        f(i);
    }
    for j in (1..lanes.len()).map(|d| (own + d) % lanes.len()) {
        while let Some(i) = lanes[j].take(false) {
            f(i);
        }
    }
}

fn worker(s: Arc<Shared>, lane: usize) {
    let generation = |s: &Shared| s.ctl.load(Ordering::SeqCst) >> 32;
    let mut seen = 0u64;
    loop {
        // A job seen while spinning is taken without touching the lock; otherwise
        // park (the caller checks `sleeping` under the lock after publishing).
        if !spin_until(|| generation(&s) != seen || s.shutdown.load(Ordering::Acquire)) {
            let mut st = lock(&s.state);
            st.sleeping += 1;
            while generation(&s) == seen && !s.shutdown.load(Ordering::SeqCst) {
                st = s.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.sleeping -= 1;
        }
        if s.shutdown.load(Ordering::SeqCst) {
            return;
        }
        // Join the newest job unless the caller has already closed it.
        let mut v = s.ctl.load(Ordering::SeqCst);
        seen = v >> 32;
        let joined = loop {
            if v >> 32 != seen || v & CLOSED != 0 {
                break false;
            }
            match s
                .ctl
                .compare_exchange(v, v + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break true,
                Err(now) => v = now,
            }
        };
        if !joined {
            continue;
        }
        // The job stays in place until every joined worker has left it, so a
        // copy taken under the lock stays valid; the lock is released before
        // computing (holding it would let one worker at a time into the job).
        let job = lock(&s.state).job;
        if let Some(job) = job {
            // SAFETY: run() keeps the closure alive until no worker is active.
            let f = unsafe { &*job.f };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| drain(&s.lanes, lane, f))) {
                lock(&s.state).panic.get_or_insert(payload);
            }
        }
        if s.ctl.fetch_sub(1, Ordering::SeqCst) & ACTIVE == 1 {
            // Taking the lock orders this with a caller about to wait on `done`.
            let st = lock(&s.state);
            if st.caller_waiting {
                s.done.notify_one();
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _st = lock(&self.shared.state);
            self.shared.shutdown.store(true, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_lane_gives_its_front_to_the_owner_and_its_back_to_others() {
        let lane = Lane(AtomicU64::new(0));
        lane.set(3, 8);
        assert_eq!(lane.take(true), Some(3));
        assert_eq!(lane.take(false), Some(7));
        assert_eq!(lane.take(true), Some(4));
        assert_eq!(lane.take(false), Some(6));
        assert_eq!(lane.take(true), Some(5));
        assert_eq!(lane.take(true), None);
        assert_eq!(lane.take(false), None);
        lane.set(0, 0);
        assert_eq!(lane.take(false), None);
    }

    #[test]
    fn each_thread_starts_on_its_own_contiguous_lane() {
        // Two threads, tasks slow enough that both join: the caller's first
        // task is 0 and the worker's is the first of the second half.
        let pool = ThreadPool::new(2);
        let first: Vec<AtomicUsize> = (0..2).map(|_| AtomicUsize::new(usize::MAX)).collect();
        let caller = std::thread::current().id();
        pool.run(8, &|i| {
            let who = usize::from(std::thread::current().id() != caller);
            let _ = first[who].compare_exchange(usize::MAX, i, Ordering::SeqCst, Ordering::SeqCst);
            std::thread::sleep(SPIN * 10);
        });
        assert_eq!(first[0].load(Ordering::SeqCst), 0);
        let w = first[1].load(Ordering::SeqCst);
        // The caller only reaches lane 1 once lane 0 is empty, and then from
        // its back: a worker that joins at all finds task 4 still there.
        assert!(w == 4 || w == usize::MAX, "worker started at {w}");
    }

    #[test]
    fn runs_every_task_once() {
        let pool = ThreadPool::new(3);
        for n in [0usize, 1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1));
        }
    }

    #[test]
    fn parked_and_spinning_threads_both_pick_up_jobs() {
        let pool = ThreadPool::new(3);
        let total = AtomicUsize::new(0);
        for round in 0..3000 {
            if round % 1000 == 0 {
                // Long enough for every worker to stop spinning and park.
                std::thread::sleep(SPIN * 5);
            }
            pool.run(5, &|i| {
                total.fetch_add(i + 1, Ordering::SeqCst);
            });
        }
        assert_eq!(total.load(Ordering::SeqCst), 3000 * 15);
        // Tasks longer than the spin window: the caller parks until the last one ends.
        let slow = AtomicUsize::new(0);
        pool.run(3, &|_| {
            std::thread::sleep(SPIN * 3);
            slow.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(slow.load(Ordering::SeqCst), 3);
    }

    /// Runs `body` on a thread of its own and returns its result, failing the
    /// test when it does not finish within `limit` (a hung pool then fails
    /// instead of hanging the run; the stuck thread is left behind).
    fn within<T: Send + 'static>(
        what: &str,
        limit: Duration,
        body: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(body());
        });
        match rx.recv_timeout(limit) {
            Ok(v) => v,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("{what}: no result within {limit:?} (a thread hangs)")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
        }
    }

    /// A barrier for `n` threads that gives up at a deadline instead of hanging.
    struct Rendezvous {
        arrived: AtomicUsize,
        n: usize,
        deadline: Instant,
    }

    impl Rendezvous {
        fn new(n: usize) -> Rendezvous {
            Rendezvous {
                arrived: AtomicUsize::new(0),
                n,
                deadline: Instant::now() + Duration::from_secs(5),
            }
        }

        /// Wait for all `n`; false when the deadline passed first (for a
        /// late arrival too: it did not meet the others inside the job).
        fn arrive(&self) -> bool {
            self.arrived.fetch_add(1, Ordering::SeqCst);
            if Instant::now() > self.deadline {
                return false;
            }
            while self.arrived.load(Ordering::SeqCst) < self.n {
                if Instant::now() > self.deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            true
        }
    }

    /// How many of `pool.threads()` tasks passed a barrier that needs every
    /// thread of the pool inside the job at once (all of them, or fewer when
    /// some thread could not get in).
    fn all_meet(pool: &ThreadPool) -> usize {
        let n = pool.threads();
        let meet = Rendezvous::new(n);
        let met = AtomicUsize::new(0);
        pool.run(n, &|_| {
            if meet.arrive() {
                met.fetch_add(1, Ordering::SeqCst);
            }
        });
        met.load(Ordering::SeqCst)
    }

    /// Whether a 100-task job runs every task exactly once.
    fn runs_each_once(pool: &ThreadPool) -> bool {
        let hits: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        pool.run(100, &|i| {
            hits[i].fetch_add(1, Ordering::SeqCst);
        });
        hits.iter().all(|h| h.load(Ordering::SeqCst) == 1)
    }

    fn message(payload: &(dyn Any + Send)) -> String {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    }

    #[test]
    fn every_thread_computes_inside_the_same_job_at_once() {
        // More threads than this machine's cores: they still all get in.
        for threads in [4, 8] {
            let met = within("barrier job", Duration::from_secs(30), move || {
                all_meet(&ThreadPool::new(threads))
            });
            assert_eq!(met, threads, "{threads} threads: {met} met inside one job");
        }
    }

    #[test]
    fn a_panic_in_a_workers_share_reaches_the_caller_and_the_pool_goes_on() {
        let (met, msg, met_after, runs_after) =
            within("worker panic", Duration::from_secs(30), || {
                let pool = ThreadPool::new(4);
                let meet = Rendezvous::new(4);
                let met = AtomicUsize::new(0);
                let caller = std::thread::current().id();
                let job = |_| {
                    if meet.arrive() {
                        met.fetch_add(1, Ordering::SeqCst);
                    }
                    if std::thread::current().id() != caller {
                        panic!("a worker's share");
                    }
                };
                let outcome = catch_unwind(AssertUnwindSafe(|| pool.run(4, &job)));
                let msg = outcome.err().map(|p| message(&*p));
                let met = met.load(Ordering::SeqCst);
                (met, msg, all_meet(&pool), runs_each_once(&pool))
            });
        assert_eq!(met, 4, "every thread ran a task");
        assert_eq!(msg.as_deref(), Some("a worker's share"));
        assert_eq!(met_after, 4, "every worker survived the panic");
        assert!(runs_after);
    }

    #[test]
    fn a_panic_in_the_callers_share_waits_for_the_workers_then_reaches_the_caller() {
        let (msg, inside, met_after, runs_after) =
            within("caller panic", Duration::from_secs(30), || {
                let pool = ThreadPool::new(4);
                let meet = Rendezvous::new(4);
                let inside = AtomicUsize::new(0);
                let caller = std::thread::current().id();
                let job = |_| {
                    inside.fetch_add(1, Ordering::SeqCst);
                    meet.arrive();
                    if std::thread::current().id() == caller {
                        inside.fetch_sub(1, Ordering::SeqCst);
                        panic!("the caller's share");
                    }
                    // The workers are still running the caller's closure as it unwinds.
                    std::thread::sleep(Duration::from_millis(50));
                    inside.fetch_sub(1, Ordering::SeqCst);
                };
                let outcome = catch_unwind(AssertUnwindSafe(|| pool.run(4, &job)));
                let msg = outcome.err().map(|p| message(&*p));
                let inside_at_unwind = inside.load(Ordering::SeqCst);
                // Keep `job` alive until no worker runs it (a broken pool left them in).
                let deadline = Instant::now() + Duration::from_secs(5);
                while inside.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                (
                    msg,
                    inside_at_unwind,
                    all_meet(&pool),
                    runs_each_once(&pool),
                )
            });
        assert_eq!(msg.as_deref(), Some("the caller's share"));
        assert_eq!(
            inside, 0,
            "workers were still inside the job when run() unwound"
        );
        assert_eq!(met_after, 4, "every thread takes part in the next job");
        assert!(runs_after);
    }
}
