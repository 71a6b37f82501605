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
// worker to finish with it before returning).
unsafe impl Send for Job {}

struct State {
    job: Option<Job>,
    /// Workers blocked (or about to block) on `wake`.
    sleeping: usize,
    /// The caller is blocked (or about to block) on `done`.
    caller_waiting: bool,
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
        drain(&s.lanes, 0, f);
        // Close the job: a worker that has not joined yet (parked, or preempted by
        // another process) never will, and is not waited for.
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
        lock(&s.state).job = None;
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
        // The job stays in place until every joined worker has left it.
        if let Some(job) = lock(&s.state).job {
            // SAFETY: run() keeps the closure alive until no worker is active.
            let f = unsafe { &*job.f };
            drain(&s.lanes, lane, f);
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
}
