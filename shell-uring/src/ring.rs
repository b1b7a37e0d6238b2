//! The one module of this crate with `unsafe`: the io_uring instance, the eventfd that wakes
//! it, and the ownership of every buffer an operation in flight points into.
//!
//! Memory named by a submission must stay valid and unaliased until the kernel posted the
//! operation's completion. Every operation is issued by a method that *takes ownership* of its
//! buffers and parks them in an op table slot until the completion hands them back. At drop,
//! operations in flight are cancelled and awaited; the buffers of any that do not finish in
//! time are leaked rather than freed.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use bytes::BytesMut;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use shell_common::SendQueue;

/// Caller-chosen identity of an operation, returned with its completion.
pub(crate) type Tag = u64;

/// An operation in flight (slot index and generation), for [`Ring::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpId(u64);

/// `IORING_RECVSEND_POLL_FIRST` (5.19+; older kernels ignore it).
const RECVSEND_POLL_FIRST: u16 = 1;
/// Transfers at least this large run in the kernel's io-wq workers (`IOSQE_ASYNC`), so the
/// socket copies of several large transfers proceed on several cores instead of all in the
/// ring thread's task work.
const ASYNC_BYTES: usize = 1 << 20;
/// `IORING_ENTER_GETEVENTS`.
const ENTER_GETEVENTS: u32 = 1;
/// Most buffers passed to one `sendmsg`.
const MAX_IOVECS: usize = 64;
/// How long [`Ring`]'s drop waits for cancelled operations.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// A finished operation, with the buffers it owned.
#[derive(Debug)]
pub(crate) enum Completion {
    /// An accepted connection, or why accepting failed.
    Accept(io::Result<TcpStream>),
    /// A receive: the buffer grew by the bytes received (`Ok(0)`: end of stream).
    Recv(BytesMut, io::Result<usize>),
    /// A send of a queue of buffers: `Ok(n)` bytes of them were sent (from the front).
    Send(SendQueue, io::Result<usize>),
    /// A socket became ready ([`Ring::poll`]); `Ok` holds the poll events.
    Ready(io::Result<usize>),
    /// The eventfd was signalled.
    Wake,
    /// A timer fired (or was cancelled).
    Timer,
    /// A cancel request or a link timeout finished; nothing to do.
    Internal,
}

/// What a slot keeps alive while its operation is in flight (the kernel reads what the
/// timers hold; heap allocations do not move when their owner moves into the slot).
#[allow(dead_code)]
enum Owned {
    Accept,
    Poll,
    Recv(BytesMut),
    Send {
        bufs: SendQueue,
        // The kernel reads these two until completion.
        iov: Vec<libc::iovec>,
        msg: Box<libc::msghdr>,
    },
    Wake(Box<[u8; 8]>),
    Timer(Box<types::Timespec>),
    Internal(Option<Box<types::Timespec>>),
}

struct Slot {
    generation: u32,
    op: Option<(Tag, Owned)>,
}

/// An io_uring instance and its op table.
pub(crate) struct Ring {
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    in_flight: usize,
    reaped: Vec<(u64, i32)>,
}

impl Ring {
    /// Creates a ring with room for `entries` submissions at once. Fails where the kernel
    /// refuses io_uring (too old: `ENOSYS`; seccomp or `kernel.io_uring_disabled`: `EPERM`).
    pub(crate) fn new(entries: u32) -> io::Result<Ring> {
        // Completions are only reaped by the one thread that submits, when it waits: let the
        // kernel defer their work to that point instead of interrupting the thread (6.1+);
        // older kernels get a plain ring.
        let ring = IoUring::builder()
            .setup_cqsize(entries.saturating_mul(4))
            .setup_coop_taskrun()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(entries)
            .or_else(|_| {
                IoUring::builder()
                    .setup_cqsize(entries.saturating_mul(4))
                    .build(entries)
            })?;
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::Accept::CODE, "ACCEPT"),
            (opcode::Recv::CODE, "RECV"),
            (opcode::SendMsg::CODE, "SENDMSG"),
            (opcode::Read::CODE, "READ"),
            (opcode::Timeout::CODE, "TIMEOUT"),
            (opcode::LinkTimeout::CODE, "LINK_TIMEOUT"),
            (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
            (opcode::PollAdd::CODE, "POLL_ADD"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("the kernel lacks IORING_OP_{name}"),
                ));
            }
        }
        Ok(Ring {
            ring,
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            reaped: Vec::new(),
        })
    }

    fn slot(&mut self, tag: Tag, owned: Owned) -> (u64, &mut Owned) {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    op: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        let user_data = (u64::from(slot.generation) << 32) | u64::from(index);
        self.in_flight += 1;
        let (_, owned) = slot.op.insert((tag, owned));
        (user_data, owned)
    }

    /// Queues an entry whose buffers are already parked in the slot of `user_data`.
    ///
    /// # Safety
    /// Every pointer in `entry` must point into memory owned by an op slot (or be null), so it
    /// stays valid until the completion of `user_data` is reaped.
    unsafe fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: the caller guarantees the entry's buffers outlive the operation.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            // The submission queue is full: hand what is queued to the kernel and retry.
            if let Err(error) = self.ring.submit() {
                if error.raw_os_error() != Some(libc::EBUSY) {
                    tracing::error!(%error, "io_uring submit failed");
                }
                self.reap();
            }
        }
    }

    /// Parks `owned` in a slot and queues the entry `build` makes from it.
    ///
    /// # Safety
    /// Every pointer in the entry must point into memory that `owned` keeps alive and in place
    /// until the completion is reaped (or be null).
    unsafe fn issue(
        &mut self,
        tag: Tag,
        owned: Owned,
        build: impl FnOnce(&mut Owned) -> squeue::Entry,
    ) -> OpId {
        let (user_data, owned) = self.slot(tag, owned);
        let entry = build(owned).user_data(user_data);
        // SAFETY: the caller guarantees the entry's buffers.
        unsafe { self.push(entry) };
        OpId(user_data)
    }

    /// Accepts one connection on `listener` (the fd must stay open until the completion).
    pub(crate) fn accept(&mut self, tag: Tag, listener: RawFd) -> OpId {
        let (addr, len) = (std::ptr::null_mut(), std::ptr::null_mut());
        let entry = opcode::Accept::new(types::Fd(listener), addr, len).flags(libc::SOCK_CLOEXEC);
        // SAFETY: no buffers (null address out-parameters).
        unsafe { self.issue(tag, Owned::Accept, |_| entry.build()) }
    }

    /// Receives up to `want` bytes into the spare capacity of `buf` (reserved here). With
    /// `wait_all` the kernel keeps receiving until `want` bytes arrived or the stream ended.
    pub(crate) fn recv(
        &mut self,
        tag: Tag,
        fd: RawFd,
        mut buf: BytesMut,
        want: usize,
        wait_all: bool,
    ) -> OpId {
        let want = want.min(u32::MAX as usize);
        buf.reserve(want);
        let spare = buf.spare_capacity_mut().as_mut_ptr().cast();
        // Between messages (right after a response went out) the next request is rarely there
        // yet: wait for readiness first instead of trying a receive that fails.
        let (flags, ioprio) = if wait_all {
            (libc::MSG_WAITALL, 0)
        } else {
            (0, RECVSEND_POLL_FIRST)
        };
        let entry = opcode::Recv::new(types::Fd(fd), spare, want as u32)
            .flags(flags)
            .ioprio(ioprio)
            .build();
        let entry = async_when(entry, want);
        // SAFETY: `spare` points at `want` reserved bytes of the `BytesMut`'s heap allocation,
        // which the slot owns (untouched, and not moving) until the completion is reaped.
        unsafe { self.issue(tag, Owned::Recv(buf), |_| entry) }
    }

    /// Sends `bufs` in order with one `sendmsg` (at most [`MAX_IOVECS`] of them; the
    /// completion tells how many bytes went out). With `timeout`, the send is cancelled when
    /// it has not completed in time.
    pub(crate) fn send(
        &mut self,
        tag: Tag,
        fd: RawFd,
        bufs: SendQueue,
        timeout: Option<Duration>,
    ) -> OpId {
        let iov: Vec<libc::iovec> = bufs
            .buffers()
            .take(MAX_IOVECS)
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len() as _;
        let msg_ptr: *const libc::msghdr = &*msg;
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        let flags = (libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32;
        let entry = opcode::SendMsg::new(types::Fd(fd), msg_ptr)
            .flags(flags)
            .build();
        let mut entry = async_when(entry, total);
        if timeout.is_some() {
            entry = entry.flags(squeue::Flags::IO_LINK);
        }
        // SAFETY: the msghdr, the iovecs and the `Bytes` they point into are owned by the slot
        // until the completion is reaped (`Bytes` never move their data).
        let op = unsafe { self.issue(tag, Owned::Send { bufs, iov, msg }, |_| entry) };
        if let Some(timeout) = timeout {
            let ts = Box::new(types::Timespec::from(timeout));
            let link = opcode::LinkTimeout::new(&*ts).build();
            // SAFETY: the timespec is owned by the link timeout's own slot.
            unsafe { self.issue(0, Owned::Internal(Some(ts)), |_| link) };
        }
        op
    }

    /// Completes once `fd` can be read (or, with `writable`, written) without blocking: the
    /// readiness half of a transfer done with [`recv_now`] / [`send_now`] straight between
    /// the socket and memory that must not be lent to the kernel across completions.
    pub(crate) fn poll(&mut self, tag: Tag, fd: RawFd, writable: bool) -> OpId {
        let entry = opcode::PollAdd::new(types::Fd(fd), poll_mask(writable) as u32).build();
        // SAFETY: no buffers.
        unsafe { self.issue(tag, Owned::Poll, |_| entry) }
    }

    /// Waits for the eventfd to be signalled.
    pub(crate) fn wait_wake(&mut self, tag: Tag, eventfd: &EventFd) -> OpId {
        let fd = types::Fd(eventfd.0.as_raw_fd());
        let read = |owned: &mut Owned| match owned {
            Owned::Wake(buf) => opcode::Read::new(fd, buf.as_mut_ptr(), 8).build(),
            _ => unreachable!("the slot holds what was just put in"),
        };
        // SAFETY: the 8-byte box is owned by the slot until the completion is reaped.
        unsafe { self.issue(tag, Owned::Wake(Box::new([0; 8])), read) }
    }

    /// A timer that completes after `after`.
    pub(crate) fn timer(&mut self, tag: Tag, after: Duration) -> OpId {
        let ts = Box::new(types::Timespec::from(after));
        let entry = opcode::Timeout::new(&*ts).build();
        // SAFETY: the timespec is owned by the slot until the completion is reaped.
        unsafe { self.issue(tag, Owned::Timer(ts), |_| entry) }
    }

    /// Asks the kernel to cancel an operation; its completion still arrives (usually with
    /// `ECANCELED`), and only then are its buffers released.
    pub(crate) fn cancel(&mut self, op: OpId) {
        let entry = opcode::AsyncCancel::new(op.0).build();
        // SAFETY: no buffers.
        unsafe { self.issue(0, Owned::Internal(None), |_| entry) };
    }

    /// Submits what is queued and waits until at least one completion is there (or `timeout`
    /// passed, when given). Interrupted waits simply return.
    pub(crate) fn submit_and_wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if !self.ring.completion().is_empty() {
            return entered(self.ring.submit());
        }
        let result = match timeout {
            None => self.ring.submit_and_wait(1).map(drop),
            Some(timeout) => {
                let ts = types::Timespec::from(timeout);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args).map(drop)
            }
        };
        entered(result)
    }

    /// Submits what is queued and takes the completions that are there, without waiting for
    /// any (the loop has other work): unlike a plain submit, the enter carries `GETEVENTS`, so
    /// the kernel also runs the deferred work that posts finished operations' completions.
    pub(crate) fn submit_no_wait(&mut self) -> io::Result<()> {
        let queued = self.ring.submission().len();
        // SAFETY: no argument structure is passed (null, size of a sigset never read), and
        // every queued entry was pushed by `push`, whose callers guarantee its buffers.
        let result = unsafe {
            self.ring
                .submitter()
                .enter::<libc::sigset_t>(queued as u32, 0, ENTER_GETEVENTS, None)
        };
        entered(result)
    }

    fn reap(&mut self) {
        let completion = self.ring.completion();
        self.reaped
            .extend(completion.map(|cqe: cqueue::Entry| (cqe.user_data(), cqe.result())));
    }

    /// Takes every completion that arrived, with the buffers of its operation.
    pub(crate) fn completions(&mut self, out: &mut Vec<(Tag, Completion)>) {
        self.reap();
        for (user_data, result) in std::mem::take(&mut self.reaped) {
            let index = (user_data & 0xffff_ffff) as usize;
            let Some(slot) = self.slots.get_mut(index) else {
                continue;
            };
            let current = u64::from(slot.generation) == user_data >> 32;
            let Some((tag, owned)) = slot.op.take_if(|_| current) else {
                continue;
            };
            self.free.push(index as u32);
            self.in_flight -= 1;
            let outcome =
                usize::try_from(result).map_err(|_| io::Error::from_raw_os_error(-result));
            let completion = match owned {
                Owned::Accept => Completion::Accept(outcome.map(|fd| {
                    // SAFETY: a successful accept returns a new descriptor that nothing else
                    // owns; the `TcpStream` takes it over and closes it.
                    unsafe { TcpStream::from_raw_fd(fd as RawFd) }
                })),
                Owned::Recv(mut buf) => {
                    if let Ok(n) = outcome {
                        // SAFETY: the kernel initialised `n` bytes of the spare capacity that
                        // `recv` reserved (n never exceeds the length it was given).
                        unsafe { buf.set_len(buf.len() + n) };
                    }
                    Completion::Recv(buf, outcome)
                }
                Owned::Send { bufs, .. } => Completion::Send(bufs, outcome),
                Owned::Poll => Completion::Ready(outcome),
                Owned::Wake(_) => Completion::Wake,
                Owned::Timer(_) => Completion::Timer,
                Owned::Internal(_) => Completion::Internal,
            };
            out.push((tag, completion));
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let live: Vec<OpId> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.op.is_some())
            .map(|(index, slot)| OpId((u64::from(slot.generation) << 32) | index as u64))
            .collect();
        for op in live {
            self.cancel(op);
        }
        let deadline = std::time::Instant::now() + DRAIN_TIMEOUT;
        let mut sink = Vec::new();
        while self.in_flight > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || self.submit_and_wait(Some(left)).is_err() {
                break;
            }
            self.completions(&mut sink);
            sink.clear();
        }
        if self.in_flight > 0 {
            // The kernel may still write into these buffers: leak them instead of freeing.
            tracing::warn!(
                operations = self.in_flight,
                "io_uring operations did not finish; leaking their buffers"
            );
            std::mem::forget(std::mem::take(&mut self.slots));
        }
    }
}

/// A non-blocking `recv` into `dst` (`WouldBlock` when nothing is there; `Ok(0)`: end of
/// stream), for data that goes straight into memory only borrowed for this call.
pub(crate) fn recv_now(stream: &TcpStream, dst: &mut [u8]) -> io::Result<usize> {
    let (ptr, len) = (dst.as_mut_ptr().cast(), dst.len());
    // SAFETY: `dst` is valid for writes of `len` bytes for the whole call, and the kernel
    // writes at most that many; the descriptor is open while `stream` is borrowed.
    checked(unsafe { libc::recv(stream.as_raw_fd(), ptr, len, libc::MSG_DONTWAIT) })
}

/// A non-blocking `send` of `src` (`WouldBlock` when the socket buffer is full; never
/// `SIGPIPE`), for data sent straight from memory only borrowed for this call.
pub(crate) fn send_now(stream: &TcpStream, src: &[u8]) -> io::Result<usize> {
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    // SAFETY: `src` is valid for reads of `src.len()` bytes for the whole call; the descriptor
    // is open while `stream` is borrowed.
    checked(unsafe { libc::send(stream.as_raw_fd(), src.as_ptr().cast(), src.len(), flags) })
}

/// Waits (blocking the calling thread, for at most `timeout`) until `stream` can be read (or,
/// with `writable`, written) without blocking; `Ok(false)` when the time ran out. Only for
/// blocking threads, never a ring's.
pub(crate) fn wait_ready(
    stream: &TcpStream,
    writable: bool,
    timeout: Duration,
) -> io::Result<bool> {
    let fd = stream.as_raw_fd();
    let mut pollfd = libc::pollfd {
        fd,
        events: poll_mask(writable),
        revents: 0,
    };
    let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid `pollfd` for the whole call; the descriptor is open while `stream` is
    // borrowed.
    match checked(unsafe { libc::poll(&mut pollfd, 1, millis) } as isize) {
        Ok(0) => Ok(false),
        // Readiness, an error, a hang-up or a signal: the next transfer call tells which.
        Ok(_) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::Interrupted => Ok(true),
        Err(error) => Err(error),
    }
}

fn poll_mask(writable: bool) -> libc::c_short {
    if writable {
        libc::POLLOUT
    } else {
        libc::POLLIN
    }
}

/// `entry`, run in the kernel's io-wq workers when it moves `bytes` >= [`ASYNC_BYTES`].
fn async_when(entry: squeue::Entry, bytes: usize) -> squeue::Entry {
    if bytes >= ASYNC_BYTES {
        entry.flags(squeue::Flags::ASYNC)
    } else {
        entry
    }
}

/// A system call's result: the error in `errno` when negative.
fn checked(n: isize) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Whether an operation ended because it was cancelled.
pub(crate) fn cancelled(error: &io::Error) -> bool {
    error.raw_os_error() == Some(libc::ECANCELED)
}

/// An eventfd: other threads signal it, the ring waits on it with [`Ring::wait_wake`].
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: plain system call without pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `eventfd` returned a new descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the counter, waking a pending read.
    pub(crate) fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local array. A full counter (EAGAIN) already
        // means a wake-up is pending, so the result needs no handling.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }
}

/// The outcome of entering the ring, with the interruptions that leave nothing to report
/// (a signal, a wait that timed out, a completion queue or kernel momentarily busy) as success:
/// the loop just collects what completions there are and goes round again.
fn entered<T>(result: io::Result<T>) -> io::Result<()> {
    result
        .map(drop)
        .or_else(|error| match error.raw_os_error() {
            Some(libc::EINTR | libc::ETIME | libc::EBUSY | libc::EAGAIN) => Ok(()),
            _ => Err(error),
        })
}
