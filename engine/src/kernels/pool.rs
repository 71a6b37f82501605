//! A small parking thread pool for data-parallel kernels.
//!
//! `run(tasks, f)` calls `f(i)` for every `i < tasks` on the caller plus the
//! workers, and returns when all are done. Workers block on a condition
//! variable between jobs (no spin-waiting: the machine's cores are shared with
//! other processes). Which thread runs which task never changes a result: the
//! kernels only split independent outputs, never a reduction.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The job being run: a lifetime-erased pointer to the caller's closure.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

// SAFETY: the pointee is `Sync` and outlives the job (run() waits for every
// worker to finish with it before returning).
unsafe impl Send for Job {}

struct State {
    generation: u64,
    job: Option<Job>,
    /// Workers still inside the current job.
    busy: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    done: Condvar,
    next: AtomicUsize,
}

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

impl ThreadPool {
    /// A pool using `threads` threads in total (the caller counts as one).
    pub fn new(threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                job: None,
                busy: 0,
                shutdown: false,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
            next: AtomicUsize::new(0),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("kvf-kernel-{i}"))
                    .spawn(move || worker(s))
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
        let _one_job = lock(&self.caller);
        // SAFETY: erase the lifetime; we wait below until no worker holds it.
        let f_static: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        self.shared.next.store(0, Ordering::SeqCst);
        {
            let mut st = lock(&self.shared.state);
            st.job = Some(Job { f: f_static, tasks });
            st.generation += 1;
            st.busy = self.workers.len();
        }
        self.shared.wake.notify_all();
        drain(&self.shared.next, tasks, f);
        let mut st = lock(&self.shared.state);
        while st.busy > 0 {
            st = self.shared.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.job = None;
    }
}

fn drain(next: &AtomicUsize, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            break;
        }
        f(i);
    }
}

fn worker(s: Arc<Shared>) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut st = lock(&s.state);
            while st.generation == seen && !st.shutdown {
                st = s.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            st.job
        };
        if let Some(job) = job {
            // SAFETY: run() keeps the closure alive until `busy` reaches 0.
            let f = unsafe { &*job.f };
            drain(&s.next, job.tasks, f);
        }
        let mut st = lock(&s.state);
        st.busy -= 1;
        if st.busy == 0 {
            s.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
