//! The one device ("fabric0"), its port and GID table, and device contexts.
use crate::ffi::*;
use crate::mr::MrTable;
use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub const DEVICE_NAME: &CStr = c"fabric0";
pub const PORT: u8 = 1;
/// Largest message the port advertises (and post_send accepts): bounds per-WR copies.
pub const MAX_MSG: u32 = 1 << 30;

struct DeviceBox(*mut ibv_device);
// SAFETY: the device struct is written once at creation and only read afterwards.
unsafe impl Send for DeviceBox {}
// SAFETY: as above, read-only after initialisation.
unsafe impl Sync for DeviceBox {}

static DEVICE: OnceLock<DeviceBox> = OnceLock::new();

fn copy_name(dst: &mut [libc::c_char], s: &[u8]) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.iter().take(n)) {
        *d = *b as libc::c_char;
    }
}

/// The process-wide device; it lives until the process exits (as libibverbs' device list does).
pub fn device() -> *mut ibv_device {
    DEVICE
        .get_or_init(|| {
            // SAFETY: ibv_device is plain C data; all-zero is a valid value for every field.
            let mut d: Box<ibv_device> = Box::new(unsafe { std::mem::zeroed() });
            d.node_type = IBV_NODE_CA;
            d.transport_type = IBV_TRANSPORT_IB;
            copy_name(&mut d.name, DEVICE_NAME.to_bytes());
            copy_name(&mut d.dev_name, b"uverbs-fabric0");
            copy_name(
                &mut d.dev_path,
                b"/sys/class/infiniband_verbs/uverbs-fabric0",
            );
            copy_name(&mut d.ibdev_path, b"/sys/class/infiniband/fabric0");
            DeviceBox(Box::into_raw(d))
        })
        .0
}

/// One GID entry: the IPv4-mapped address of an interface of this network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gid {
    pub gid: ibv_gid,
    pub ifindex: u32,
}

pub fn ipv4_mapped(a: [u8; 4]) -> ibv_gid {
    let mut raw = [0u8; 16];
    raw[10] = 0xff;
    raw[11] = 0xff;
    raw[12..].copy_from_slice(&a);
    ibv_gid { raw }
}

/// RoCE v2 GIDs of every IPv4 address (loopback included) of the calling process's namespace.
pub fn local_gids() -> Vec<Gid> {
    let mut out: Vec<Gid> = Vec::new();
    let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut ifa) } != 0 {
        return out;
    }
    let mut cur = ifa;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, valid until freeifaddrs.
        let node = unsafe { &*cur };
        cur = node.ifa_next;
        if node.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null; sa_family tells the real type.
        if unsafe { (*node.ifa_addr).sa_family } as i32 != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(node.ifa_addr as *const libc::sockaddr_in) };
        let gid = ipv4_mapped(sin.sin_addr.s_addr.to_ne_bytes());
        // SAFETY: ifa_name is a NUL-terminated interface name.
        let ifindex = unsafe { libc::if_nametoindex(node.ifa_name) };
        if !out.iter().any(|g| g.gid == gid) {
            out.push(Gid { gid, ifindex });
        }
    }
    // SAFETY: ifa came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifa) };
    out
}

/// Directory holding the queue pairs' sockets: `$GGML_VERBS_FABRIC_DIR`, else /tmp/ggml-verbs-fabric.
pub fn fabric_dir() -> PathBuf {
    std::env::var_os("GGML_VERBS_FABRIC_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/ggml-verbs-fabric"))
}

/// A device context: the C struct first, so `*mut ibv_context` and `*mut Context` are one pointer.
#[repr(C)]
pub struct Context {
    pub ibv: ibv_context,
    pub gids: Arc<Vec<Gid>>,
    pub mrs: Arc<MrTable>,
}

pub fn port_attr(ctx: &Context) -> ibv_port_attr {
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: IBV_MTU_1024,
        gid_tbl_len: ctx.gids.len() as i32,
        max_msg_sz: MAX_MSG,
        pkey_tbl_len: 1,
        lid: 0,
        active_width: 1,
        active_speed: 1,
        phys_state: 5, // LinkUp
        link_layer: IBV_LINK_LAYER_ETHERNET,
        ..Default::default()
    }
}
