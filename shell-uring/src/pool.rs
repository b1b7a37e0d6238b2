//! The blocking threads: heavy backend calls and comm link work run here, never on a ring.
//! Threads start on demand (when no idle one is left, up to a cap) and end after a while
//! without work, like tokio's blocking pool; each runs with the server's tracing dispatcher.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

type Job = Box<dyn FnOnce() + Send>;

/// How long an idle thread waits for work before it ends.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most threads.
const MAX_THREADS: usize = 256;

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    idle: usize,
    threads: usize,
    closed: bool,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    ready: Condvar,
    dispatch: tracing::Dispatch,
}

/// A pool of blocking threads whose jobs log to `dispatch`.
pub(crate) struct Pool(Arc<Inner>);

impl Pool {
    pub(crate) fn new(dispatch: tracing::Dispatch) -> Pool {
        Pool(Arc::new(Inner {
            dispatch,
            ..Inner::default()
        }))
    }

    /// Runs `job` on a pool thread.
    pub(crate) fn execute(&self, job: impl FnOnce() + Send + 'static) {
        let mut state = lock(&self.0.state);
        state.jobs.push_back(Box::new(job));
        if state.jobs.len() > state.idle && state.threads < MAX_THREADS {
            let inner = self.0.clone();
            let spawned = std::thread::Builder::new()
                .name("rpc-uring-blocking".into())
                .spawn(move || worker(&inner));
            match spawned {
                Ok(_) => state.threads += 1,
                Err(error) => tracing::error!(%error, "cannot start a blocking thread"),
            }
        } else {
            self.0.ready.notify_one();
        }
    }

    /// Lets idle threads end at once (running jobs finish).
    pub(crate) fn close(&self) {
        lock(&self.0.state).closed = true;
        self.0.ready.notify_all();
    }
}

/// Locks `mutex`: a job that panicked poisons nothing relied on (the state is consistent
/// between calls).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn worker(inner: &Inner) {
    let _dispatch = tracing::dispatcher::set_default(&inner.dispatch);
    let mut state = lock(&inner.state);
    loop {
        if let Some(job) = state.jobs.pop_front() {
            drop(state);
            job();
            state = lock(&inner.state);
            continue;
        }
        if state.closed {
            break;
        }
        state.idle += 1;
        let (next, waited) = inner
            .ready
            .wait_timeout(state, IDLE_TIMEOUT)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state = next;
        state.idle -= 1;
        if waited.timed_out() && state.jobs.is_empty() {
            break;
        }
    }
    state.threads -= 1;
}
