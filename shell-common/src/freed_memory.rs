//! Giving the heap memory that finished work freed back to the system (glibc).
//!
//! glibc's malloc raises its mmap threshold each time it frees a block that came from `mmap`
//! (up to 32 MiB), so after a few large transfers, blocks of several MiB (read chunks, replies)
//! come from the heap arenas instead, and stay there when freed: a thread arena's top shrinks
//! only on its own frees, past a trim threshold that rises with the mmap threshold, and
//! `malloc_trim` never shrinks it. A server whose clients had all gone held over a hundred MiB
//! more than before them (the soak, README "Soak"). So the server fixes the threshold at start
//! ([`return_large_blocks`]: blocks of 4 MiB and more map and unmap, smaller ones stay cheap) and
//! trims the arenas when a connection ends ([`release`]): rarely (llama.cpp keeps one
//! connection for a whole session), and cheap next to what a connection's end frees.

/// Blocks of at least this many bytes come straight from `mmap` and go straight back.
pub const MMAP_THRESHOLD: usize = 4 << 20;

/// Fixes the allocator's mmap threshold at [`MMAP_THRESHOLD`] (which also stops glibc from
/// raising its trim threshold). Call once, at start, before the threads.
#[allow(unsafe_code)]
pub fn return_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only changes glibc's allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
    }
}

/// Returns the free pages of the allocator's arenas to the system (glibc; elsewhere nothing).
#[allow(unsafe_code)]
pub fn release() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer; it walks glibc's own arenas under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}
