//! `#[repr(C)]` mirrors of the parts of rdma-core 44's `<infiniband/verbs.h>` this library fills
//! or reads. Sizes and offsets are asserted at compile time against the real header (build.rs).
#![allow(non_camel_case_types, non_upper_case_globals)]

use libc::{c_char, c_int, c_uint, c_void, pthread_cond_t, pthread_mutex_t};

/// `union ibv_gid`: 16 raw bytes, 8-byte aligned (its other member is two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

#[repr(C)]
pub struct _ibv_device_ops {
    pub _dummy1: *mut c_void,
    pub _dummy2: *mut c_void,
}

#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// The context's operation table; only the four data-path entries the header's inline functions
/// jump through are filled, the rest stay NULL (as for providers that lack them).
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: *mut c_void,
    pub _compat_query_port: *mut c_void,
    pub _compat_alloc_pd: *mut c_void,
    pub _compat_dealloc_pd: *mut c_void,
    pub _compat_reg_mr: *mut c_void,
    pub _compat_rereg_mr: *mut c_void,
    pub _compat_dereg_mr: *mut c_void,
    pub alloc_mw: *mut c_void,
    pub bind_mw: *mut c_void,
    pub dealloc_mw: *mut c_void,
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyFn>,
    pub _compat_cq_event: *mut c_void,
    pub _compat_resize_cq: *mut c_void,
    pub _compat_destroy_cq: *mut c_void,
    pub _compat_create_srq: *mut c_void,
    pub _compat_modify_srq: *mut c_void,
    pub _compat_query_srq: *mut c_void,
    pub _compat_destroy_srq: *mut c_void,
    pub post_srq_recv: *mut c_void,
    pub _compat_create_qp: *mut c_void,
    pub _compat_query_qp: *mut c_void,
    pub _compat_modify_qp: *mut c_void,
    pub _compat_destroy_qp: *mut c_void,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: *mut c_void,
    pub _compat_destroy_ah: *mut c_void,
    pub _compat_attach_mcast: *mut c_void,
    pub _compat_detach_mcast: *mut c_void,
    pub _compat_async_event: *mut c_void,
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    /// NULL: not an extended (`verbs_context`) context, so the header's inline helpers fall back to
    /// the exported functions (`ibv_query_port` in particular).
    pub abi_compat: *mut c_void,
}

#[repr(C)]
#[derive(Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    /// union { rdma, atomic, ud }: unused (SEND only).
    pub wr: [u64; 4],
    /// union { xrc }: unused.
    pub qp_type: u32,
    /// union { bind_mw, tso }: unused.
    pub bind_mw: [u64; 6],
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

include!(concat!(env!("OUT_DIR"), "/layout_checks.rs"));

// enum ibv_wc_status
pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_LOC_LEN_ERR: c_uint = 1;
pub const IBV_WC_LOC_QP_OP_ERR: c_uint = 2;
pub const IBV_WC_LOC_PROT_ERR: c_uint = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub const IBV_WC_REM_INV_REQ_ERR: c_uint = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_uint = 10;
pub const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
// enum ibv_wc_opcode
pub const IBV_WC_SEND: c_uint = 0;
pub const IBV_WC_RECV: c_uint = 128;
// enum ibv_wr_opcode / ibv_send_flags
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
// enum ibv_qp_type / ibv_qp_state
pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_ERR: c_uint = 6;
// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_CUR_STATE: c_int = 1 << 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_ALT_PATH: c_int = 1 << 14;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_PATH_MIG_STATE: c_int = 1 << 18;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
// enum ibv_mtu, port state, gid type, node/transport type, link layer
pub const IBV_MTU_1024: c_uint = 3;
pub const IBV_MTU_4096: c_uint = 5;
pub const IBV_PORT_ACTIVE: c_uint = 4;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
pub const IBV_NODE_CA: c_int = 1;
pub const IBV_TRANSPORT_IB: c_int = 0;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
