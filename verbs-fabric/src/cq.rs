//! Completion queues and completion channels. A channel's fd is the read end of a pipe: one byte
//! is written per CQ event, so `poll()` on it behaves as on a kernel channel.
use crate::error::{FabricError, Result};
use crate::ffi::{ibv_comp_channel, ibv_cq, ibv_wc};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub struct ChanInner {
    rfd: OwnedFd,
    wfd: OwnedFd,
    /// CQs (as `*mut ibv_cq` addresses) whose events were signalled but not yet fetched.
    events: Mutex<VecDeque<usize>>,
}

#[repr(C)]
pub struct Channel {
    pub ibv: ibv_comp_channel,
    pub inner: Arc<ChanInner>,
}

impl ChanInner {
    pub fn new() -> Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into fds.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: both descriptors are fresh and owned only here.
        let (rfd, wfd) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: plain fcntl on our own descriptor; a full pipe must never block a completer.
        unsafe { libc::fcntl(wfd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        Ok(ChanInner {
            rfd,
            wfd,
            events: Mutex::new(VecDeque::new()),
        })
    }

    pub fn fd(&self) -> i32 {
        self.rfd.as_raw_fd()
    }

    fn events(&self) -> MutexGuard<'_, VecDeque<usize>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify(&self, cq: usize) {
        self.events().push_back(cq);
        let b = 1u8;
        // SAFETY: writing one byte from a local to our own pipe.
        unsafe { libc::write(self.wfd.as_raw_fd(), (&b as *const u8).cast(), 1) };
    }

    /// Blocks (unless the app made the fd non-blocking) until an event, and returns its CQ.
    pub fn get_event(&self) -> Result<usize> {
        let mut b = 0u8;
        loop {
            // SAFETY: reading one byte into a local from our own pipe.
            let n = unsafe { libc::read(self.rfd.as_raw_fd(), (&mut b as *mut u8).cast(), 1) };
            if n == 1 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if n < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(FabricError::Io(e));
        }
        self.events()
            .pop_front()
            .ok_or(FabricError::Invalid("channel event without a CQ"))
    }
}

struct CqState {
    wcs: VecDeque<ibv_wc>,
    armed: bool,
}

pub struct CqInner {
    state: Mutex<CqState>,
    chan: Option<Arc<ChanInner>>,
    /// The `*mut ibv_cq` handed to the application, reported back by `ibv_get_cq_event`.
    cq_ptr: AtomicUsize,
    capacity: usize,
}

#[repr(C)]
pub struct Cq {
    pub ibv: ibv_cq,
    pub inner: Arc<CqInner>,
}

impl CqInner {
    pub fn new(capacity: usize, chan: Option<Arc<ChanInner>>) -> Self {
        CqInner {
            state: Mutex::new(CqState {
                wcs: VecDeque::new(),
                armed: false,
            }),
            chan,
            cq_ptr: AtomicUsize::new(0),
            capacity,
        }
    }

    pub fn set_ptr(&self, p: *mut ibv_cq) {
        self.cq_ptr.store(p as usize, Ordering::Release);
    }

    fn lock(&self) -> MutexGuard<'_, CqState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a completion; an armed CQ fires one channel event. Beyond capacity the completion is
    /// dropped (a real CQ overruns and reports an async error; callers size their CQs).
    pub fn push(&self, wc: ibv_wc) {
        let mut st = self.lock();
        if st.wcs.len() >= self.capacity {
            return;
        }
        st.wcs.push_back(wc);
        if st.armed {
            st.armed = false;
            if let Some(ch) = &self.chan {
                ch.notify(self.cq_ptr.load(Ordering::Acquire));
            }
        }
    }

    pub fn poll(&self, out: &mut [ibv_wc]) -> usize {
        let mut st = self.lock();
        let n = out.len().min(st.wcs.len());
        for (slot, wc) in out.iter_mut().zip(st.wcs.drain(..n)) {
            *slot = wc;
        }
        n
    }

    pub fn arm(&self) -> Result<()> {
        if self.chan.is_none() {
            return Err(FabricError::Invalid("CQ has no completion channel"));
        }
        self.lock().armed = true;
        Ok(())
    }
}
