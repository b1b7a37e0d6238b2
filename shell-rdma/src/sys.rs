//! The real queue pair over libibverbs (`rdma-sys`), set up exactly as the reference's
//! (PROTOCOL.md §10.3): the probe ([`probe`]: device and GID for the TCP connection's local
//! address, PD, completion channel, CQs, RC QP, the registered staging buffer and receive
//! ring), activation ([`Prepared::activate`]: INIT → 24 receives → RTR → RTS), the data path
//! ([`IbvQueuePair`], the [`Verbs`] implementation) and teardown of everything on drop.

use std::alloc::{self, Layout};
use std::ffi::CStr;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::{self, NonNull};
use std::time::Duration;

use rdma_sys::*;

use crate::caps::{choose_gid, target_gid, GidEntry, GidKind, RdmaCaps};
use crate::verbs::{Completion, Cq, Verbs, VerbsError, Wake, RDMA_CHUNK, RDMA_RX_DEPTH};

/// The only port the reference uses.
const IB_PORT: u8 = 1;

extern "C" {
    // SAFETY (declaration): libibverbs ≥ 32 exports it; `ibv_query_gid_ex` is an inline
    // wrapper around it in verbs.h that bindgen does not see.
    fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> libc::c_int;
}

/// A 4096-byte aligned heap buffer (the registered regions).
struct Aligned {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Aligned {
    fn new(len: usize) -> Option<Aligned> {
        let layout = Layout::from_size_align(len, 4096).ok()?;
        // SAFETY: `len` is non-zero (both regions are at least 256 KiB).
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
        Some(Aligned { ptr, layout })
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Every verbs object of one connection; dropped in the reference's teardown order.
struct Resources {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
    scq: *mut ibv_cq,
    rcq: *mut ibv_cq,
    qp: *mut ibv_qp,
    tx_mr: *mut ibv_mr,
    rx_mr: *mut ibv_mr,
    tx: Option<Aligned>,
    rx: Option<Aligned>,
}

// SAFETY: verbs objects may be used from any thread; one connection's are used by one
// thread at a time (the value moves, it is never shared).
unsafe impl Send for Resources {}

impl Drop for Resources {
    fn drop(&mut self) {
        // SAFETY: each pointer is null or a live object created for this connection, destroyed
        // once here, dependants first; every CQ event was acknowledged when it was fetched.
        unsafe {
            if !self.tx_mr.is_null() {
                ibv_dereg_mr(self.tx_mr);
            }
            if !self.rx_mr.is_null() {
                ibv_dereg_mr(self.rx_mr);
            }
            if !self.qp.is_null() {
                ibv_destroy_qp(self.qp);
            }
            if !self.scq.is_null() {
                ibv_destroy_cq(self.scq);
            }
            if !self.rcq.is_null() {
                ibv_destroy_cq(self.rcq);
            }
            if !self.channel.is_null() {
                ibv_destroy_comp_channel(self.channel);
            }
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            if !self.ctx.is_null() {
                ibv_close_device(self.ctx);
            }
        }
        // The buffers go after their registrations.
        self.tx.take();
        self.rx.take();
    }
}

/// A probed, not yet connected queue pair: what this side announces in HELLO.
pub struct Prepared {
    res: Resources,
    caps: RdmaCaps,
    gid_index: u8,
    path_mtu: ibv_mtu::Type,
    inline: usize,
    device: String,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("device", &self.device)
            .field("caps", &self.caps)
            .field("gid_index", &self.gid_index)
            .finish_non_exhaustive()
    }
}

/// Why the probe found no usable device (the connection stays on TCP).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No device holds a RoCE GID equal to the connection's local address.
    #[error("no RDMA device with a RoCE GID for {0}")]
    NoDevice(IpAddr),
    /// A set-up call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

/// Probes for the connection whose TCP local address is `local` (§10.3's device/GID choice,
/// `GGML_RDMA_DEV`, `GGML_RDMA_GID`) and prepares the queue pair and its buffers.
pub fn probe(local: IpAddr) -> Result<Prepared, ProbeError> {
    let dev_env = std::env::var("GGML_RDMA_DEV").ok();
    let forced = std::env::var("GGML_RDMA_GID")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok());
    let target = target_gid(local);
    let (ctx, gid_index, path_mtu, device) =
        open_device(dev_env.as_deref(), &target, forced).ok_or(ProbeError::NoDevice(local))?;
    let mut res = Resources {
        ctx,
        pd: ptr::null_mut(),
        channel: ptr::null_mut(),
        scq: ptr::null_mut(),
        rcq: ptr::null_mut(),
        qp: ptr::null_mut(),
        tx_mr: ptr::null_mut(),
        rx_mr: ptr::null_mut(),
        tx: None,
        rx: None,
    };
    // SAFETY: `ctx` is an open device; every object is created on it and owned by `res`,
    // which destroys what was created if a later step fails.
    unsafe {
        res.pd = nonnull(ibv_alloc_pd(ctx), "ibv_alloc_pd")?;
        res.channel = nonnull(ibv_create_comp_channel(ctx), "ibv_create_comp_channel")?;
        res.scq = nonnull(
            ibv_create_cq(ctx, 16, ptr::null_mut(), res.channel, 0),
            "ibv_create_cq",
        )?;
        res.rcq = nonnull(
            ibv_create_cq(
                ctx,
                RDMA_RX_DEPTH as i32 + 4,
                ptr::null_mut(),
                res.channel,
                0,
            ),
            "ibv_create_cq",
        )?;
        let mut init: ibv_qp_init_attr = std::mem::zeroed();
        init.send_cq = res.scq;
        init.recv_cq = res.rcq;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = 4;
        init.cap.max_recv_wr = RDMA_RX_DEPTH as u32 + 4;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = 256;
        res.qp = nonnull(ibv_create_qp(res.pd, &mut init), "ibv_create_qp")?;
        let inline = init.cap.max_inline_data as usize;
        let tx =
            Aligned::new(RDMA_CHUNK).ok_or_else(|| VerbsError::errno("alloc", libc::ENOMEM))?;
        let rx = Aligned::new(RDMA_CHUNK * RDMA_RX_DEPTH)
            .ok_or_else(|| VerbsError::errno("alloc", libc::ENOMEM))?;
        let local_write = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        let remote_write = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0 as i32;
        res.tx_mr = nonnull(
            ibv_reg_mr(res.pd, tx.ptr.as_ptr().cast(), RDMA_CHUNK, local_write),
            "ibv_reg_mr",
        )?;
        res.tx = Some(tx);
        res.rx_mr = nonnull(
            ibv_reg_mr(
                res.pd,
                rx.ptr.as_ptr().cast(),
                RDMA_CHUNK * RDMA_RX_DEPTH,
                local_write | remote_write,
            ),
            "ibv_reg_mr",
        )?;
        res.rx = Some(rx);
        let mut gid: ibv_gid = std::mem::zeroed();
        if ibv_query_gid(ctx, IB_PORT, i32::from(gid_index), &mut gid) != 0 {
            return Err(VerbsError::last_os("ibv_query_gid").into());
        }
        let caps = RdmaCaps::for_qp((*res.qp).qp_num, gid.raw);
        tracing::info!(
            "RDMA probed: dev={device} gid={gid_index} qpn={} inline={inline}",
            caps.qpn
        );
        Ok(Prepared {
            res,
            caps,
            gid_index,
            path_mtu,
            inline,
            device,
        })
    }
}

/// The names of the RDMA devices libibverbs lists (for the banner).
pub fn device_names() -> Vec<String> {
    let mut n = 0;
    // SAFETY: the list is read while it lives and freed once.
    unsafe {
        let list = ibv_get_device_list(&mut n);
        if list.is_null() {
            return Vec::new();
        }
        let names = (0..usize::try_from(n).unwrap_or(0))
            .map(|i| {
                CStr::from_ptr(ibv_get_device_name(*list.add(i)))
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        ibv_free_device_list(list);
        names
    }
}

fn nonnull<T>(p: *mut T, call: &'static str) -> Result<*mut T, VerbsError> {
    if p.is_null() {
        Err(VerbsError::last_os(call))
    } else {
        Ok(p)
    }
}

/// Opens the first device (named `dev`, if given) whose port 1 holds the GID to use.
fn open_device(
    dev: Option<&str>,
    target: &[u8; 16],
    forced: Option<u32>,
) -> Option<(*mut ibv_context, u8, ibv_mtu::Type, String)> {
    let mut n = 0;
    // SAFETY: the list is freed below; devices are only opened from it while it lives.
    unsafe {
        let list = ibv_get_device_list(&mut n);
        if list.is_null() {
            return None;
        }
        let mut found = None;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            let device = *list.add(i);
            let name = CStr::from_ptr(ibv_get_device_name(device))
                .to_string_lossy()
                .into_owned();
            if dev.is_some_and(|d| d != name) {
                continue;
            }
            let ctx = ibv_open_device(device);
            if ctx.is_null() {
                continue;
            }
            let mut port: ibv_port_attr = std::mem::zeroed();
            if ___ibv_query_port(ctx, IB_PORT, &mut port) != 0 {
                ibv_close_device(ctx);
                continue;
            }
            let entries: Vec<GidEntry> = if forced.is_some() {
                Vec::new()
            } else {
                (0..u32::try_from(port.gid_tbl_len).unwrap_or(0))
                    .filter_map(|index| {
                        let mut e: ibv_gid_entry = std::mem::zeroed();
                        let rc = _ibv_query_gid_ex(
                            ctx,
                            u32::from(IB_PORT),
                            index,
                            &mut e,
                            0,
                            std::mem::size_of::<ibv_gid_entry>(),
                        );
                        let kind = match e.gid_type {
                            IBV_GID_TYPE_ROCE_V2 => GidKind::RoceV2,
                            IBV_GID_TYPE_ROCE_V1 => GidKind::RoceV1,
                            _ => GidKind::Ib,
                        };
                        (rc == 0).then_some(GidEntry {
                            index,
                            gid: e.gid.raw,
                            kind,
                        })
                    })
                    .collect()
            };
            match choose_gid(&entries, target, forced).and_then(|g| u8::try_from(g).ok()) {
                Some(gid) => {
                    found = Some((ctx, gid, port.active_mtu, name));
                    break;
                }
                None => {
                    ibv_close_device(ctx);
                }
            }
        }
        ibv_free_device_list(list);
        found
    }
}

impl Prepared {
    /// This side's caps for HELLO.
    pub fn caps(&self) -> RdmaCaps {
        self.caps
    }

    /// Connects the queue pair to the peer's caps: INIT, the 24 receives, RTR, RTS. `tcp`
    /// (a duplicate of the connection's socket) is polled for the peer's hang-up.
    pub fn activate(self, peer: RdmaCaps, tcp: OwnedFd) -> Result<IbvQueuePair, VerbsError> {
        let qp = self.res.qp;
        // SAFETY: `qp` is this connection's live QP; the attribute structs live across each call.
        unsafe {
            let mut a: ibv_qp_attr = std::mem::zeroed();
            a.qp_state = ibv_qp_state::IBV_QPS_INIT;
            a.pkey_index = 0;
            a.port_num = IB_PORT;
            a.qp_access_flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
                | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
                | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
            let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
                | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
                | ibv_qp_attr_mask::IBV_QP_PORT.0
                | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
            modify(qp, &mut a, mask)?;
        }
        let mut pair = IbvQueuePair {
            inline: self.inline,
            tcp,
            res: self.res,
        };
        for slot in 0..RDMA_RX_DEPTH {
            pair.post_recv(slot)?;
        }
        // SAFETY: as above.
        unsafe {
            let mut a: ibv_qp_attr = std::mem::zeroed();
            a.qp_state = ibv_qp_state::IBV_QPS_RTR;
            a.path_mtu = self.path_mtu;
            a.dest_qp_num = peer.qpn;
            a.rq_psn = peer.psn;
            a.max_dest_rd_atomic = 1;
            a.min_rnr_timer = 1;
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = peer.gid;
            a.ah_attr.grh.sgid_index = self.gid_index;
            a.ah_attr.grh.hop_limit = 1;
            a.ah_attr.dlid = 0;
            a.ah_attr.port_num = IB_PORT;
            let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
                | ibv_qp_attr_mask::IBV_QP_AV.0
                | ibv_qp_attr_mask::IBV_QP_PATH_MTU.0
                | ibv_qp_attr_mask::IBV_QP_DEST_QPN.0
                | ibv_qp_attr_mask::IBV_QP_RQ_PSN.0
                | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
                | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0;
            modify(qp, &mut a, mask)?;

            let mut a: ibv_qp_attr = std::mem::zeroed();
            a.qp_state = ibv_qp_state::IBV_QPS_RTS;
            a.timeout = 14;
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.sq_psn = self.caps.psn;
            a.max_rd_atomic = 1;
            let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
                | ibv_qp_attr_mask::IBV_QP_TIMEOUT.0
                | ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0
                | ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0
                | ibv_qp_attr_mask::IBV_QP_SQ_PSN.0
                | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0;
            modify(qp, &mut a, mask)?;
        }
        tracing::info!(
            "RDMA activated: qpn={}->{} rx_depth={RDMA_RX_DEPTH}",
            self.caps.qpn,
            peer.qpn
        );
        Ok(pair)
    }
}

/// # Safety
/// `qp` must be a live queue pair.
unsafe fn modify(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32) -> Result<(), VerbsError> {
    // SAFETY: the caller's contract; `attr` is a valid attribute block.
    let rc = unsafe { ibv_modify_qp(qp, attr, mask as i32) };
    if rc != 0 {
        return Err(VerbsError::errno("ibv_modify_qp", rc));
    }
    Ok(())
}

/// An activated queue pair: the [`Verbs`] of a live connection.
pub struct IbvQueuePair {
    res: Resources,
    inline: usize,
    tcp: OwnedFd,
}

impl IbvQueuePair {
    fn cq(&self, cq: Cq) -> *mut ibv_cq {
        match cq {
            Cq::Send => self.res.scq,
            Cq::Recv => self.res.rcq,
        }
    }

    fn ring(&self) -> *mut u8 {
        self.res
            .rx
            .as_ref()
            .map_or(ptr::null_mut(), |b| b.ptr.as_ptr())
    }
}

#[cfg(feature = "hostile-peer")]
impl IbvQueuePair {
    /// Posts one signalled SEND of `len` bytes taken from this side's registered receive ring
    /// (at most its 24 × 256 KiB), longer than the peer's receive slot when `len` exceeds
    /// [`RDMA_CHUNK`]: what a hostile peer does. For tests of the receiving side only (feature
    /// `hostile-peer`); the data path never calls it.
    pub fn post_oversized_send(&mut self, len: usize) -> Result<(), VerbsError> {
        let ring = self.ring();
        let Ok(length) = u32::try_from(len) else {
            return Err(VerbsError::errno("ibv_post_send", libc::EINVAL));
        };
        if len > RDMA_RX_DEPTH * RDMA_CHUNK || ring.is_null() {
            return Err(VerbsError::errno("ibv_post_send", libc::EINVAL));
        }
        // SAFETY: `len` bytes from the start of the ring lie inside the ring, registered as
        // `rx_mr`; the provider reads them during the call or before the completion, and the
        // ring outlives the QP; the QP is live.
        unsafe {
            let sge = ibv_sge {
                addr: ring as u64,
                length,
                lkey: (*self.res.rx_mr).lkey,
            };
            post_signaled_send(self.res.qp, sge, 0)
        }
    }
}

/// Posts one signaled SEND of `sge`, with `flags` besides SIGNALED.
///
/// # Safety
/// `qp` is a live queue pair; `sge` names memory the provider may read until the send's
/// completion (registered under `sge.lkey`), or inline data it copies during the call.
unsafe fn post_signaled_send(
    qp: *mut ibv_qp,
    mut sge: ibv_sge,
    flags: u32,
) -> Result<(), VerbsError> {
    // SAFETY: an all-zero work request is a valid empty one; the caller vouches for `qp` and
    // `sge`, which outlives the call.
    unsafe {
        let mut wr: ibv_send_wr = std::mem::zeroed();
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        wr.num_sge = 1;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0 | flags;
        wr.sg_list = &mut sge;
        let mut bad = ptr::null_mut();
        let rc = ibv_post_send(qp, &mut wr, &mut bad);
        if rc != 0 {
            return Err(VerbsError::errno("ibv_post_send", rc));
        }
    }
    Ok(())
}

impl Verbs for IbvQueuePair {
    fn inline_limit(&self) -> usize {
        self.inline
    }

    fn post_send(&mut self, data: &[u8]) -> Result<(), VerbsError> {
        if data.len() > RDMA_CHUNK {
            return Err(VerbsError::errno("ibv_post_send", libc::EINVAL));
        }
        // SAFETY: the staging buffer is RDMA_CHUNK bytes and registered as `tx_mr`; inline
        // data is copied by the provider during the call; the QP is live.
        unsafe {
            let length = data.len() as u32;
            if data.len() <= self.inline {
                let sge = ibv_sge {
                    addr: data.as_ptr() as u64,
                    length,
                    lkey: 0,
                };
                post_signaled_send(self.res.qp, sge, ibv_send_flags::IBV_SEND_INLINE.0)
            } else {
                let tx = self
                    .res
                    .tx
                    .as_ref()
                    .map_or(ptr::null_mut(), |b| b.ptr.as_ptr());
                ptr::copy_nonoverlapping(data.as_ptr(), tx, data.len());
                let sge = ibv_sge {
                    addr: tx as u64,
                    length,
                    lkey: (*self.res.tx_mr).lkey,
                };
                post_signaled_send(self.res.qp, sge, 0)
            }
        }
    }

    fn post_recv(&mut self, slot: usize) -> Result<(), VerbsError> {
        if slot >= RDMA_RX_DEPTH {
            return Err(VerbsError::errno("ibv_post_recv", libc::EINVAL));
        }
        // SAFETY: slot `slot` lies inside the registered ring; the QP is live.
        unsafe {
            let mut sge = ibv_sge {
                addr: self.ring().add(slot * RDMA_CHUNK) as u64,
                length: RDMA_CHUNK as u32,
                lkey: (*self.res.rx_mr).lkey,
            };
            let mut wr: ibv_recv_wr = std::mem::zeroed();
            wr.wr_id = slot as u64;
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            let mut bad = ptr::null_mut();
            let rc = ibv_post_recv(self.res.qp, &mut wr, &mut bad);
            if rc != 0 {
                return Err(VerbsError::errno("ibv_post_recv", rc));
            }
        }
        Ok(())
    }

    fn copy_from_slot(&self, slot: usize, offset: usize, dst: &mut [u8]) {
        // The stream checked slot < 24 and offset + len ≤ the completion's length ≤ 256 KiB.
        let start = slot * RDMA_CHUNK + offset;
        assert!(slot < RDMA_RX_DEPTH && offset + dst.len() <= RDMA_CHUNK);
        // SAFETY: `[start, start + len)` lies inside the ring (checked above), which the
        // device no longer writes: the slot is not re-posted before it is consumed.
        unsafe { ptr::copy_nonoverlapping(self.ring().add(start), dst.as_mut_ptr(), dst.len()) }
    }

    fn poll(&mut self, cq: Cq) -> Result<Option<Completion>, VerbsError> {
        // SAFETY: the CQ is live; `wc` is one entry.
        unsafe {
            let mut wc: ibv_wc = std::mem::zeroed();
            let n = ibv_poll_cq(self.cq(cq), 1, &mut wc);
            if n < 0 {
                return Err(VerbsError::errno("ibv_poll_cq", -n));
            }
            if n == 0 {
                return Ok(None);
            }
            let status = if wc.status == ibv_wc_status::IBV_WC_SUCCESS {
                Ok(wc.byte_len)
            } else {
                let text = CStr::from_ptr(ibv_wc_status_str(wc.status)).to_string_lossy();
                Err(format!(
                    "status={} ({text}) vendor_err={:#x}",
                    wc.status, wc.vendor_err
                ))
            };
            Ok(Some(Completion {
                wr_id: wc.wr_id,
                status,
            }))
        }
    }

    fn arm(&mut self, cq: Cq) -> Result<(), VerbsError> {
        // SAFETY: the CQ is live.
        let rc = unsafe { ibv_req_notify_cq(self.cq(cq), 0) };
        if rc != 0 {
            return Err(VerbsError::errno("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    fn sleep(&mut self, timeout: Duration) -> Result<Wake, VerbsError> {
        // SAFETY: the channel is live; `fds` are two valid descriptors.
        unsafe {
            let mut fds = [
                libc::pollfd {
                    fd: (*self.res.channel).fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                // Not POLLIN: bytes a peer writes on the TCP socket after the switch must not
                // wake this sleep (hang-ups and errors are always reported).
                libc::pollfd {
                    fd: self.tcp.as_raw_fd(),
                    events: libc::POLLRDHUP,
                    revents: 0,
                },
            ];
            let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
            let r = libc::poll(fds.as_mut_ptr(), 2, ms);
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    return Ok(Wake::Timeout);
                }
                return Err(VerbsError {
                    call: "poll",
                    source: e,
                });
            }
            if r == 0 {
                return Ok(Wake::Timeout);
            }
            if fds[1].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0 {
                return Ok(Wake::HangUp);
            }
            if fds[0].revents & libc::POLLIN != 0 {
                let mut cq = ptr::null_mut();
                let mut ctx = ptr::null_mut();
                if ibv_get_cq_event(self.res.channel, &mut cq, &mut ctx) != 0 {
                    return Err(VerbsError::last_os("ibv_get_cq_event"));
                }
                ibv_ack_cq_events(cq, 1);
                return Ok(Wake::Event);
            }
            Ok(Wake::Timeout)
        }
    }

    fn peer_alive(&mut self) -> Result<bool, VerbsError> {
        let mut fd = libc::pollfd {
            fd: self.tcp.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid descriptor, no wait.
        let r = unsafe { libc::poll(&mut fd, 1, 0) };
        Ok(!(r > 0 && fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_no_device_holds_finds_no_device() {
        // TEST-NET-1: no interface, so no GID table, holds it (and nothing leaks on the way).
        let local: IpAddr = "192.0.2.77".parse().unwrap();
        match probe(local) {
            Err(ProbeError::NoDevice(at)) => assert_eq!(at, local),
            other => panic!("expected no device, got {other:?}"),
        }
    }
}
