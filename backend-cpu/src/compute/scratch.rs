//! Per-thread spare vectors for kernels' scratch rows.
//!
//! A decode step runs dozens of small nodes, each of which needs a few rows of scratch per
//! work item; allocating and freeing them every time was a measurable part of a generated
//! token's server time outside the matrix products. [`zeroed`] hands out a vector of the
//! length asked, zeroed as a fresh one would be, taken from the calling thread's spares when
//! it has one; dropping the [`Scratch`] gives it back. Nothing is shared between threads, and
//! a thread keeps only a few vectors of bounded total size, so memory stays small.
//!
//! A prompt's per-node activation copies (a few hundred KiB to some MiB) come from here too:
//! freshly allocated every node, glibc hands such sizes back to the kernel and takes them
//! again, and every page of them faults anew.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::thread::LocalKey;

/// Spare vectors a thread keeps per element type.
const KEPT: usize = 16;

/// Bytes of capacity a thread keeps per element type, all its spares together; a vector that
/// would take the total past it is freed instead of kept.
const KEPT_BYTES: usize = 16 << 20;

/// An element type with a per-thread spare list.
pub(crate) trait Spare: Copy + Default + 'static {
    /// The calling thread's spares of this type.
    fn spares() -> &'static LocalKey<RefCell<Vec<Vec<Self>>>>;
}

macro_rules! spare_type {
    ($($t:ty => $key:ident),* $(,)?) => {$(
        thread_local! {
            static $key: RefCell<Vec<Vec<$t>>> = const { RefCell::new(Vec::new()) };
        }
        impl Spare for $t {
            fn spares() -> &'static LocalKey<RefCell<Vec<Vec<Self>>>> {
                &$key
            }
        }
    )*};
}

spare_type!(f32 => SPARE_F32, u8 => SPARE_U8, u16 => SPARE_U16, usize => SPARE_USIZE);

/// A scratch vector; derefs to `Vec<T>` (kernels may resize it) and goes back to the thread's
/// spares on drop.
#[derive(Debug)]
pub(crate) struct Scratch<T: Spare>(Vec<T>);

/// An empty vector with room for at least `capacity` elements, from the thread's spares when
/// it has one: the smallest that holds `capacity`, else the largest (grown), so that small
/// and large requests interleaving keep their own vectors instead of growing each other's.
pub(crate) fn with_capacity<T: Spare>(capacity: usize) -> Scratch<T> {
    let mut v = T::spares()
        .try_with(|s| {
            let mut s = s.borrow_mut();
            let fits = |v: &Vec<T>| v.capacity() >= capacity;
            let best = (0..s.len())
                .filter(|&i| fits(&s[i]))
                .min_by_key(|&i| s[i].capacity())
                .or_else(|| (0..s.len()).max_by_key(|&i| s[i].capacity()));
            best.map(|i| s.swap_remove(i))
        })
        .ok()
        .flatten()
        .unwrap_or_default();
    v.clear();
    v.reserve(capacity);
    Scratch(v)
}

/// A vector of `len` zeros (`T::default()`), as [`with_capacity`] picks it.
pub(crate) fn zeroed<T: Spare>(len: usize) -> Scratch<T> {
    let mut v = with_capacity(len);
    v.resize(len, T::default());
    v
}

/// No spare taken: an empty vector that allocates only if it grows.
impl<T: Spare> Default for Scratch<T> {
    fn default() -> Self {
        Scratch(Vec::new())
    }
}

impl<T: Spare> Deref for Scratch<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T: Spare> DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<T: Spare> Drop for Scratch<T> {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        let bytes = |v: &Vec<T>| v.capacity() * std::mem::size_of::<T>();
        if v.capacity() == 0 || bytes(&v) > KEPT_BYTES {
            return;
        }
        // During thread teardown the list may be gone: the vector is then simply freed.
        let _ = T::spares().try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                let kept: usize = s.iter().map(bytes).sum();
                if s.len() < KEPT && kept + bytes(&v) <= KEPT_BYTES {
                    s.push(v);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_vectors_come_back_zeroed_and_sized() {
        let ptr = {
            let mut a = zeroed::<f32>(100);
            a.iter_mut().for_each(|x| *x = 7.0);
            a.push(1.0);
            a.as_ptr()
        };
        let b = zeroed::<f32>(50);
        assert_eq!(b.as_ptr(), ptr, "the spare was reused");
        assert_eq!(b.len(), 50);
        assert!(b.iter().all(|&x| x == 0.0));
        let c = zeroed::<f32>(10);
        assert_ne!(c.as_ptr(), b.as_ptr(), "two live scratches never share");
    }

    #[test]
    fn the_best_fitting_spare_is_taken() {
        let (small, large) = (zeroed::<f32>(16), zeroed::<f32>(4096));
        let (small_ptr, large_ptr) = (small.as_ptr(), large.as_ptr());
        drop(large);
        drop(small);
        let a = zeroed::<f32>(1000);
        assert_eq!(a.as_ptr(), large_ptr, "the one that holds it");
        let b = zeroed::<f32>(8);
        assert_eq!(b.as_ptr(), small_ptr, "the small one, not a fresh vector");
    }

    #[test]
    fn huge_vectors_are_not_kept() {
        drop(zeroed::<u8>(KEPT_BYTES + 1));
        let kept = SPARE_U8.with(|s| s.borrow().iter().map(|v| v.capacity()).max());
        assert!(kept.unwrap_or(0) <= KEPT_BYTES);
    }

    #[test]
    fn with_capacity_is_empty_and_takes_the_spare_that_holds_it() {
        let (small, large) = (zeroed::<u16>(8), zeroed::<u16>(1000));
        let large_ptr = large.as_ptr();
        drop(large);
        drop(small);
        let v = with_capacity::<u16>(500);
        assert!(v.is_empty());
        assert!(v.capacity() >= 500);
        assert_eq!(
            v.as_ptr(),
            large_ptr,
            "the one that holds it, not the small one grown"
        );
        let none = Scratch::<u16>::default();
        assert_eq!(none.capacity(), 0, "a default takes no spare");
        assert_eq!(
            SPARE_U16.with(|s| s.borrow().len()),
            1,
            "the small one still kept"
        );
    }

    #[test]
    fn a_thread_keeps_a_bounded_total() {
        let half = KEPT_BYTES / 2 / std::mem::size_of::<usize>();
        let three: Vec<_> = (0..3).map(|_| zeroed::<usize>(half)).collect();
        drop(three);
        let kept: usize = SPARE_USIZE.with(|s| s.borrow().iter().map(|v| v.capacity()).sum());
        assert_eq!(kept, 2 * half, "two halves kept, the third freed");
    }

    #[test]
    fn a_thread_keeps_a_bounded_number() {
        let many: Vec<_> = (0..3 * KEPT).map(|_| zeroed::<u16>(4)).collect();
        drop(many);
        assert_eq!(SPARE_U16.with(|s| s.borrow().len()), KEPT);
    }
}
