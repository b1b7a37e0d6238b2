//! RC queue pairs: the state machine with a real device's attribute-mask rules, work queues and
//! completions. The socket side (threads, wire format) is in `wire.rs`.
use crate::cq::CqInner;
use crate::device::Gid;
use crate::error::{FabricError, Result};
use crate::ffi::*;
use crate::mr::MrTable;
use std::collections::VecDeque;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

pub const MAX_WR: u32 = 4096;
pub const MAX_SGE: u32 = 16;
pub const MAX_INLINE: u32 = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    pub qpn: u32,
    pub gid: ibv_gid,
}

pub struct RecvWr {
    pub wr_id: u64,
    /// Checked (address, length) pieces; `None` when an SGE failed the MR check.
    pub sges: Option<Vec<(usize, usize)>>,
}

pub struct SendWr {
    pub wr_id: u64,
    pub data: Vec<u8>,
    pub signaled: bool,
}

#[derive(Default)]
pub struct QpState {
    pub state: u32,
    pub remote: Option<Remote>,
    pub recvs: VecDeque<RecvWr>,
    pub sends: VecDeque<SendWr>,
    /// A send taken by the sender thread and not yet acknowledged (it still uses a WQE).
    pub in_flight: bool,
    /// Streams to shut down on destroy (wakes threads blocked on them).
    pub streams: Vec<UnixStream>,
    pub sender: Option<JoinHandle<()>>,
    pub connected_once: bool,
}

pub struct QpInner {
    pub qpn: u32,
    pub pd: usize,
    pub gids: Arc<Vec<Gid>>,
    pub mrs: Arc<MrTable>,
    pub send_cq: Arc<CqInner>,
    pub recv_cq: Arc<CqInner>,
    pub cap: ibv_qp_cap,
    pub sig_all: bool,
    pub st: Mutex<QpState>,
    pub cv: Condvar,
    pub dir: PathBuf,
    pub sock_path: PathBuf,
    pub timeout: Duration,
    pub stop: AtomicBool,
}

#[repr(C)]
pub struct Qp {
    pub ibv: ibv_qp,
    pub inner: Arc<QpInner>,
    pub listener: Option<UnixListener>,
    pub acceptor: Option<JoinHandle<()>>,
}

fn wc(wr_id: u64, status: u32, opcode: u32, byte_len: u32, qpn: u32, src_qp: u32) -> ibv_wc {
    ibv_wc {
        wr_id,
        status,
        opcode,
        byte_len,
        qp_num: qpn,
        src_qp,
        ..Default::default()
    }
}

/// Required and optional attribute masks per RC transition (IBA 11.2.4.2 / the kernel's
/// `ib_modify_qp_is_ok` table); anything else in the mask is EINVAL.
fn transition_masks(cur: u32, next: u32) -> Option<(i32, i32)> {
    let to_reset_or_err = (IBV_QP_STATE, 0);
    match (cur, next) {
        (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => Some(to_reset_or_err),
        (IBV_QPS_RESET, IBV_QPS_INIT) => Some((
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            0,
        )),
        (IBV_QPS_INIT, IBV_QPS_INIT) => Some((
            IBV_QP_STATE,
            IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        )),
        (IBV_QPS_INIT, IBV_QPS_RTR) => Some((
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
            IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
        )),
        (IBV_QPS_RTR, IBV_QPS_RTS) => Some((
            IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC,
            IBV_QP_CUR_STATE
                | IBV_QP_ALT_PATH
                | IBV_QP_ACCESS_FLAGS
                | IBV_QP_MIN_RNR_TIMER
                | IBV_QP_PATH_MIG_STATE,
        )),
        (IBV_QPS_RTS, IBV_QPS_RTS) => Some((
            IBV_QP_STATE,
            IBV_QP_CUR_STATE
                | IBV_QP_ACCESS_FLAGS
                | IBV_QP_ALT_PATH
                | IBV_QP_PATH_MIG_STATE
                | IBV_QP_MIN_RNR_TIMER,
        )),
        _ => None,
    }
}

/// What a valid modify asks the caller to do after the state change.
pub enum Modified {
    Nothing,
    StartSender,
}

impl QpInner {
    pub fn lock(&self) -> MutexGuard<'_, QpState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn modify(&self, attr: &ibv_qp_attr, mask: i32) -> Result<Modified> {
        let mut st = self.lock();
        let next = if mask & IBV_QP_STATE != 0 {
            attr.qp_state
        } else {
            st.state
        };
        let (req, opt) =
            transition_masks(st.state, next).ok_or(FabricError::Invalid("QP state transition"))?;
        if mask & req != req || mask & !(req | opt) != 0 {
            return Err(FabricError::Invalid("attribute mask for this transition"));
        }
        if mask & IBV_QP_PORT != 0 && attr.port_num != crate::device::PORT {
            return Err(FabricError::Invalid("port_num"));
        }
        if mask & IBV_QP_PKEY_INDEX != 0 && attr.pkey_index != 0 {
            return Err(FabricError::Invalid("pkey_index"));
        }
        if mask & IBV_QP_PATH_MTU != 0 && !(1..=IBV_MTU_4096).contains(&attr.path_mtu) {
            return Err(FabricError::Invalid("path_mtu"));
        }
        let mut out = Modified::Nothing;
        match next {
            IBV_QPS_RTR if st.state == IBV_QPS_INIT => {
                let ah = &attr.ah_attr;
                // RoCE: every address carries a GRH whose source GID must exist locally.
                if ah.is_global == 0 || ah.grh.sgid_index as usize >= self.gids.len() {
                    return Err(FabricError::Invalid(
                        "ah_attr (RoCE needs a GRH with a valid sgid_index)",
                    ));
                }
                if attr.dest_qp_num > 0xff_ffff || attr.rq_psn > 0xff_ffff {
                    return Err(FabricError::Invalid("dest_qp_num / rq_psn beyond 24 bits"));
                }
                if st.connected_once {
                    return Err(FabricError::Unsupported("reconnecting a QP after RESET"));
                }
                st.remote = Some(Remote {
                    qpn: attr.dest_qp_num,
                    gid: ah.grh.dgid,
                });
                st.connected_once = true;
                out = Modified::StartSender;
            }
            IBV_QPS_RTS if mask & IBV_QP_SQ_PSN != 0 && attr.sq_psn > 0xff_ffff => {
                return Err(FabricError::Invalid("sq_psn beyond 24 bits"));
            }
            IBV_QPS_RESET => {
                st.recvs.clear();
                st.sends.clear();
            }
            _ => {}
        }
        if next == IBV_QPS_ERR {
            self.enter_error(&mut st);
        } else {
            st.state = next;
        }
        self.cv.notify_all();
        Ok(out)
    }

    /// Moves the QP to ERR and flushes every queued work request (as a real RC QP does).
    pub fn enter_error(&self, st: &mut QpState) {
        st.state = IBV_QPS_ERR;
        let src = st.remote.map_or(0, |r| r.qpn);
        for r in st.recvs.drain(..) {
            self.recv_cq.push(wc(
                r.wr_id,
                IBV_WC_WR_FLUSH_ERR,
                IBV_WC_RECV,
                0,
                self.qpn,
                src,
            ));
        }
        for s in st.sends.drain(..) {
            self.send_cq.push(wc(
                s.wr_id,
                IBV_WC_WR_FLUSH_ERR,
                IBV_WC_SEND,
                0,
                self.qpn,
                0,
            ));
        }
        self.cv.notify_all();
    }

    pub fn complete_send(&self, wr: &SendWr, status: u32) {
        if status != IBV_WC_SUCCESS || wr.signaled {
            let len = if status == IBV_WC_SUCCESS {
                wr.data.len() as u32
            } else {
                0
            };
            self.send_cq
                .push(wc(wr.wr_id, status, IBV_WC_SEND, len, self.qpn, 0));
        }
    }

    pub fn complete_recv(&self, wr_id: u64, status: u32, len: u32, src: u32) {
        self.recv_cq
            .push(wc(wr_id, status, IBV_WC_RECV, len, self.qpn, src));
    }

    /// Posts one send WR. Data (inline or from registered memory) is copied now.
    ///
    /// # Safety
    /// `wr.sg_list` must point to `wr.num_sge` SGEs and each SGE's address range must be readable.
    pub unsafe fn post_send(&self, wr: &ibv_send_wr) -> Result<()> {
        if wr.opcode != IBV_WR_SEND {
            return Err(FabricError::Unsupported("only IBV_WR_SEND"));
        }
        let n = usize::try_from(wr.num_sge).map_err(|_| FabricError::Invalid("num_sge"))?;
        if n > self.cap.max_send_sge as usize || (n > 0 && wr.sg_list.is_null()) {
            return Err(FabricError::Invalid("num_sge"));
        }
        let sges: &[ibv_sge] = if n == 0 {
            &[]
        } else {
            // SAFETY: the caller guarantees sg_list holds num_sge entries.
            unsafe { std::slice::from_raw_parts(wr.sg_list, n) }
        };
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        let inline = wr.send_flags & IBV_SEND_INLINE != 0;
        if inline && total > u64::from(self.cap.max_inline_data) {
            return Err(FabricError::Invalid("inline data beyond max_inline_data"));
        }
        if total > u64::from(crate::device::MAX_MSG) {
            return Err(FabricError::Invalid(
                "message larger than the port's max_msg_sz",
            ));
        }
        let mut st = self.lock();
        match st.state {
            IBV_QPS_RTS => {}
            IBV_QPS_ERR => {
                let w = SendWr {
                    wr_id: wr.wr_id,
                    data: Vec::new(),
                    signaled: true,
                };
                self.send_cq.push(wc(
                    w.wr_id,
                    IBV_WC_WR_FLUSH_ERR,
                    IBV_WC_SEND,
                    0,
                    self.qpn,
                    0,
                ));
                return Ok(());
            }
            _ => return Err(FabricError::Invalid("post_send before RTS")),
        }
        if st.sends.len() + usize::from(st.in_flight) >= self.cap.max_send_wr as usize {
            return Err(FabricError::QueueFull);
        }
        let mut data = Vec::with_capacity(total as usize);
        for s in sges {
            let piece = if inline {
                Some((s.addr as usize, s.length as usize))
            } else {
                self.mrs.check(s, self.pd, 0)
            };
            let Some((addr, len)) = piece else {
                // Local protection error: the WR completes in error and the QP breaks.
                self.send_cq.push(wc(
                    wr.wr_id,
                    IBV_WC_LOC_PROT_ERR,
                    IBV_WC_SEND,
                    0,
                    self.qpn,
                    0,
                ));
                self.enter_error(&mut st);
                return Ok(());
            };
            if len > 0 {
                // SAFETY: inline: the caller vouches for the buffer; otherwise the range lies
                // inside a region the application registered and keeps alive.
                data.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(addr as *const u8, len)
                });
            }
        }
        let signaled = self.sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0;
        st.sends.push_back(SendWr {
            wr_id: wr.wr_id,
            data,
            signaled,
        });
        self.cv.notify_all();
        Ok(())
    }

    /// Posts one receive WR; its SGEs are checked now and a bad one fails the WR when a message
    /// arrives (as a device reports it: a LOC_PROT_ERR completion).
    ///
    /// # Safety
    /// `wr.sg_list` must point to `wr.num_sge` SGEs.
    pub unsafe fn post_recv(&self, wr: &ibv_recv_wr) -> Result<()> {
        let n = usize::try_from(wr.num_sge).map_err(|_| FabricError::Invalid("num_sge"))?;
        if n > self.cap.max_recv_sge as usize || (n > 0 && wr.sg_list.is_null()) {
            return Err(FabricError::Invalid("num_sge"));
        }
        let sges: &[ibv_sge] = if n == 0 {
            &[]
        } else {
            // SAFETY: the caller guarantees sg_list holds num_sge entries.
            unsafe { std::slice::from_raw_parts(wr.sg_list, n) }
        };
        let checked: Option<Vec<(usize, usize)>> = sges
            .iter()
            .map(|s| self.mrs.check(s, self.pd, IBV_ACCESS_LOCAL_WRITE))
            .collect();
        let mut st = self.lock();
        match st.state {
            IBV_QPS_RESET => return Err(FabricError::Invalid("post_recv in RESET")),
            IBV_QPS_ERR => {
                let src = st.remote.map_or(0, |r| r.qpn);
                self.complete_recv(wr.wr_id, IBV_WC_WR_FLUSH_ERR, 0, src);
                return Ok(());
            }
            _ => {}
        }
        if st.recvs.len() >= self.cap.max_recv_wr as usize {
            return Err(FabricError::QueueFull);
        }
        st.recvs.push_back(RecvWr {
            wr_id: wr.wr_id,
            sges: checked,
        });
        self.cv.notify_all();
        Ok(())
    }
}
