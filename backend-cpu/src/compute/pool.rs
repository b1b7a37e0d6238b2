//! The compute threads.
//!
//! A node's kernel cuts its work into items (usually destination parts, see
//! `memory::Dst::split_rows`) and hands them to [`Pool::run`]: the calling thread and up to
//! `threads - 1` scoped helpers pull items from a shared queue until it is empty. Items are
//! claimed dynamically, so uneven items balance out; which thread runs an item never changes
//! what the item computes, so results do not depend on the thread count.
//!
//! Threads are scoped to one node (`std::thread::scope`): no `'static` bounds, no unsafe
//! lifetime erasure, and a node's borrows end when it returns. Spawning costs a few
//! microseconds per helper, so kernels hand over a single item for small nodes, which then runs
//! on the calling thread without spawning anything (see [`Pool::chunk`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use proto_core::{Error, Result};

/// Work below this many element-operations runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// Items per thread that kernels aim for, so that dynamic claiming can balance uneven items.
const ITEMS_PER_THREAD: usize = 4;

/// The compute threads of one backend (`-t N`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pool {
    threads: usize,
}

impl Pool {
    /// A pool of `threads` threads (the caller included); 0 is taken as 1.
    pub(crate) fn new(threads: usize) -> Pool {
        Pool {
            threads: threads.max(1),
        }
    }

    /// How many of `units` (rows, usually) to put in one item when each unit costs about
    /// `cost` element-operations: everything in one item for small work or one thread,
    /// otherwise about [`ITEMS_PER_THREAD`] items per thread.
    pub(crate) fn chunk(&self, units: usize, cost: usize) -> usize {
        let units = units.max(1);
        if self.threads == 1 || units.saturating_mul(cost) < PARALLEL_MIN_WORK {
            return units;
        }
        let items = (self.threads * ITEMS_PER_THREAD).min(units);
        units.div_ceil(items)
    }

    /// Runs `work` on every item, on up to `threads` threads; returns the first error (the
    /// remaining items are then skipped).
    pub(crate) fn run<T: Send>(
        &self,
        items: Vec<T>,
        work: &(dyn Fn(T) -> Result<()> + Sync),
    ) -> Result<()> {
        self.run_with(items, || (), |_, item| work(item))
    }

    /// [`Pool::run`] with per-thread state: each thread makes its state once with `init`
    /// (scratch buffers, caches) and hands it to `work` for every item it claims, so items do
    /// not allocate.
    pub(crate) fn run_with<T: Send, S>(
        &self,
        items: Vec<T>,
        init: impl Fn() -> S + Sync,
        work: impl Fn(&mut S, T) -> Result<()> + Sync,
    ) -> Result<()> {
        let workers = self.threads.min(items.len());
        if workers <= 1 {
            let mut state = init();
            return items.into_iter().try_for_each(|item| work(&mut state, item));
        }
        let queue = Mutex::new(items.into_iter());
        let failure: Mutex<Option<Error>> = Mutex::new(None);
        let stop = AtomicBool::new(false);
        let worker = || {
            let mut state = init();
            while !stop.load(Ordering::Relaxed) {
                // A panicking item poisons nothing that matters: the iterator stays valid.
                let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
                let Some(item) = next else { break };
                if let Err(error) = work(&mut state, item) {
                    stop.store(true, Ordering::Relaxed);
                    failure
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get_or_insert(error);
                }
            }
        };
        std::thread::scope(|scope| {
            for _ in 1..workers {
                scope.spawn(worker);
            }
            worker();
        });
        match failure.into_inner().unwrap_or_else(PoisonError::into_inner) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn runs_every_item_once_on_several_threads() {
        let pool = Pool::new(4);
        let seen: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        pool.run((0..100).collect(), &|i: usize| {
            seen[i].fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn reports_an_error_and_stops() {
        let pool = Pool::new(3);
        let ran = AtomicUsize::new(0);
        let result = pool.run((0..1000).collect(), &|i: usize| {
            ran.fetch_add(1, Ordering::Relaxed);
            if i == 5 {
                Err(Error::Backend("five".into()))
            } else {
                Ok(())
            }
        });
        assert_eq!(result, Err(Error::Backend("five".into())));
        assert!(ran.load(Ordering::Relaxed) < 1000);
    }

    #[test]
    fn chunks_keep_small_work_on_one_item() {
        let pool = Pool::new(8);
        assert_eq!(pool.chunk(10, 10), 10);
        assert_eq!(pool.chunk(1000, 4096), 1000_usize.div_ceil(32));
        assert_eq!(Pool::new(1).chunk(1000, 4096), 1000);
        assert_eq!(pool.chunk(0, 1), 1);
    }
}
