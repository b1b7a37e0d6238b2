//! The compute threads.
//!
//! A node's kernel cuts its work into items (usually destination parts, see
//! `memory::Dst::split_rows`) and hands them to [`Pool::run`] / [`Pool::run_with`]; the items
//! run on the backend's `threads` worker threads, each item claimed as a whole by one thread
//! (work stealing balances uneven items). Which thread runs an item never changes what the
//! item computes, so results do not depend on the thread count.
//!
//! The workers are a rayon pool, built on first use and kept for the backend's lifetime: its
//! scoped jobs may borrow the node's memory (no `'static` bounds, no lifetime erasure of our
//! own), and a node costs a wake-up instead of thread spawns — spawning per node (measured with
//! `std::thread::scope`) cost more than the small nodes of a decode step take to compute. If
//! the pool cannot be built (no threads to be had), items run on the calling thread.
//! Kernels hand over a single item for small nodes, which then runs on the calling thread
//! without involving the workers at all (see [`Pool::chunk`]).

use std::sync::OnceLock;

use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, ParallelIterator};

use proto_core::Result;

/// Work below this many element-operations runs on the calling thread: waking workers costs
/// tens of microseconds on a busy machine, about what a memory-bound op on 256 Ki elements
/// takes alone.
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// Items per thread that kernels aim for, so that stealing can balance uneven items.
const ITEMS_PER_THREAD: usize = 4;

/// The compute threads of one backend (`-t N`).
pub(crate) struct Pool {
    threads: usize,
    /// [`PARALLEL_MIN_WORK`], or 0 in tests that want every node split.
    min_work: usize,
    workers: OnceLock<Option<rayon::ThreadPool>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads)
            .field("started", &self.workers.get().is_some())
            .finish()
    }
}

impl Pool {
    /// A pool of `threads` threads; 0 is taken as 1. No thread starts before the first node
    /// that needs more than one.
    pub(crate) fn new(threads: usize) -> Pool {
        Pool {
            threads: threads.max(1),
            min_work: PARALLEL_MIN_WORK,
            workers: OnceLock::new(),
        }
    }

    /// A pool that splits every node, however small (tests of the parallel paths).
    #[cfg(test)]
    pub(crate) fn eager(threads: usize) -> Pool {
        Pool {
            min_work: 0,
            ..Pool::new(threads)
        }
    }

    fn workers(&self) -> Option<&rayon::ThreadPool> {
        self.workers
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(self.threads)
                    .thread_name(|i| format!("cpu-compute-{i}"))
                    .build()
                    .ok()
            })
            .as_ref()
    }

    /// The number of compute threads.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// How many of `units` (rows, usually) to put in one item when each unit costs about
    /// `cost` element-operations: everything in one item for small work or one thread,
    /// otherwise about [`ITEMS_PER_THREAD`] items per thread.
    pub(crate) fn chunk(&self, units: usize, cost: usize) -> usize {
        let units = units.max(1);
        if self.threads == 1 || units.saturating_mul(cost) < self.min_work {
            return units;
        }
        let items = (self.threads * ITEMS_PER_THREAD).min(units);
        units.div_ceil(items)
    }

    /// Runs `work` on every item; returns an error of a failing item (the remaining items are
    /// then skipped).
    pub(crate) fn run<T: Send>(
        &self,
        items: impl IntoIterator<Item = T, IntoIter: ExactSizeIterator>,
        work: &(dyn Fn(T) -> Result<()> + Sync),
    ) -> Result<()> {
        self.run_with(items, || (), |_, item| work(item))
    }

    /// [`Pool::run`] with scratch state: `init` makes a state (buffers, caches) that `work`
    /// reuses for the items one thread runs in a row, so items need not allocate. With one
    /// thread, or one item, everything runs on the calling thread, without collecting the
    /// items into a list first.
    pub(crate) fn run_with<T: Send, S>(
        &self,
        items: impl IntoIterator<Item = T, IntoIter: ExactSizeIterator>,
        init: impl Fn() -> S + Sync + Send,
        work: impl Fn(&mut S, T) -> Result<()> + Sync + Send,
    ) -> Result<()> {
        let items = items.into_iter();
        if self.threads == 1 || items.len() <= 1 {
            let mut state = init();
            return items
                .into_iter()
                .try_for_each(|item| work(&mut state, item));
        }
        let items: Vec<T> = items.collect();
        match self.workers() {
            Some(workers) => workers.install(|| {
                items
                    .into_par_iter()
                    .with_max_len(1)
                    .try_for_each_init(init, |state, item| work(state, item))
            }),
            None => {
                let mut state = init();
                items
                    .into_iter()
                    .try_for_each(|item| work(&mut state, item))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto_core::Error;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    #[test]
    fn runs_every_item_once_on_several_threads() {
        let pool = Pool::new(4);
        let seen: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        let threads = Mutex::new(HashSet::new());
        pool.run(0..100, &|i: usize| {
            seen[i].fetch_add(1, Ordering::Relaxed);
            threads.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(std::time::Duration::from_micros(200));
            Ok(())
        })
        .unwrap();
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
        assert!(threads.lock().unwrap().len() > 1, "work was spread");
    }

    #[test]
    fn reports_an_error_and_stops() {
        let pool = Pool::new(3);
        let ran = AtomicUsize::new(0);
        let result = pool.run(0..1000, &|i: usize| {
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
        assert_eq!(pool.chunk(1000, 100), 1000);
        assert_eq!(pool.chunk(1000, 4096), 1000_usize.div_ceil(32));
        assert_eq!(Pool::new(1).chunk(1000, 4096), 1000);
        assert_eq!(pool.chunk(0, 1), 1);
    }

    #[test]
    fn one_thread_never_starts_workers() {
        let pool = Pool::new(1);
        pool.run(vec![1, 2, 3], &|_| Ok(())).unwrap();
        assert!(pool.workers.get().is_none());
    }
}
