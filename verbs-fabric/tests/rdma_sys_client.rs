//! A Rust client over `rdma-sys` (the bindings our RDMA data path uses), in two processes: the
//! test re-runs its own binary as side A and side B with `LD_LIBRARY_PATH` at the fabric. The
//! bindings link the system's libibverbs at build time; at run time both sides get the fabric
//! (the device must be "fabric0", so another libibverbs fails the test). Exercised the way
//! llama.cpp's transport does it: rdma-sys's `___ibv_query_port`, `ibv_query_gid`, RC QP
//! through INIT/RTR/RTS, pre-posted receives, inline and registered SENDs, the completion
//! channel under `poll()`.
use rdma_sys::*;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

const ROLE: &str = "VFAB_RDMA_SYS_ROLE";
const RDV: &str = "VFAB_RDMA_SYS_RDV";
const SLOT: usize = 256 * 1024;
const SLOTS: usize = 4;

#[test]
fn rdma_sys_client_pair() {
    if let Ok(role) = std::env::var(ROLE) {
        // SAFETY: the side drives the verbs API with the lifetimes each call requires.
        unsafe {
            side(
                &role,
                Path::new(&std::env::var(RDV).expect("rendezvous dir")),
            )
        };
        return;
    }
    let work = tempfile::Builder::new()
        .prefix("vfab-rs-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let lib = work.path().join("lib");
    common::link_fabric(&lib);
    let exe = std::env::current_exe().expect("current_exe");
    let spawn = |role: &str| {
        Command::new("timeout")
            .arg("120")
            .arg(&exe)
            .args([
                "rdma_sys_client_pair",
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(ROLE, role)
            .env(RDV, work.path())
            .env("LD_LIBRARY_PATH", &lib)
            .env("GGML_VERBS_FABRIC_DIR", work.path().join("sock"))
            .spawn()
            .expect("spawn side")
    };
    let (mut a, mut b) = (spawn("a"), spawn("b"));
    let (sa, sb) = (a.wait().expect("wait a"), b.wait().expect("wait b"));
    assert!(sa.success() && sb.success(), "side a: {sa}, side b: {sb}");
    // A filter that matched nothing would also exit 0: each side leaves a marker when done.
    for role in ["a", "b"] {
        assert!(
            work.path().join(format!("{role}.ok")).is_file(),
            "side {role} did not run"
        );
    }
}

fn write_addr(rdv: &Path, role: &str, qpn: u32, gid: &[u8; 16]) {
    let hex: String = gid.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = rdv.join(format!("{role}.tmp"));
    std::fs::write(&tmp, format!("{qpn} {hex}")).expect("write address");
    std::fs::rename(&tmp, rdv.join(format!("{role}.addr"))).expect("publish address");
}

fn read_addr(rdv: &Path, role: &str) -> (u32, [u8; 16]) {
    let path: PathBuf = rdv.join(format!("{role}.addr"));
    let end = Instant::now() + Duration::from_secs(30);
    let text = loop {
        if let Ok(t) = std::fs::read_to_string(&path) {
            break t;
        }
        assert!(Instant::now() < end, "peer address never appeared");
        std::thread::sleep(Duration::from_millis(10));
    };
    let (qpn, hex) = text.split_once(' ').expect("address format");
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex");
    }
    (qpn.parse().expect("qpn"), gid)
}

/// Polls `cq` until one completion or 10 s.
unsafe fn wait_wc(cq: *mut ibv_cq) -> ibv_wc {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let mut wc: ibv_wc = std::mem::zeroed();
        let n = ibv_poll_cq(cq, 1, &mut wc);
        assert!(n >= 0, "ibv_poll_cq failed");
        if n == 1 {
            return wc;
        }
        assert!(Instant::now() < end, "no completion");
        std::thread::sleep(Duration::from_millis(1));
    }
}

unsafe fn post_recv(qp: *mut ibv_qp, mr: *mut ibv_mr, base: *mut u8, slot: usize) {
    let mut sge = ibv_sge {
        addr: base.add(slot * SLOT) as u64,
        length: SLOT as u32,
        lkey: (*mr).lkey,
    };
    let mut wr: ibv_recv_wr = std::mem::zeroed();
    wr.wr_id = slot as u64;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    let mut bad = std::ptr::null_mut();
    assert_eq!(ibv_post_recv(qp, &mut wr, &mut bad), 0, "ibv_post_recv");
}

unsafe fn post_send(qp: *mut ibv_qp, sge: ibv_sge, id: u64, inline: bool) {
    let mut sge = sge;
    let mut wr: ibv_send_wr = std::mem::zeroed();
    wr.wr_id = id;
    wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0
        | if inline {
            ibv_send_flags::IBV_SEND_INLINE.0
        } else {
            0
        };
    let mut bad = std::ptr::null_mut();
    assert_eq!(ibv_post_send(qp, &mut wr, &mut bad), 0, "ibv_post_send");
}

unsafe fn side(role: &str, rdv: &Path) {
    let mut n = 0;
    let list = ibv_get_device_list(&mut n);
    assert!(!list.is_null() && n == 1, "device list");
    let name = CStr::from_ptr(ibv_get_device_name(*list))
        .to_string_lossy()
        .into_owned();
    assert_eq!(name, "fabric0", "not running on the fabric");
    let ctx = ibv_open_device(*list);
    ibv_free_device_list(list);
    assert!(!ctx.is_null());
    let mut port: ibv_port_attr = std::mem::zeroed();
    assert_eq!(___ibv_query_port(ctx, 1, &mut port), 0, "query port");
    assert_eq!(port.state, ibv_port_state::IBV_PORT_ACTIVE);
    let want = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1];
    let gid_index = (0..port.gid_tbl_len)
        .find(|&i| {
            let mut g: ibv_gid = std::mem::zeroed();
            ibv_query_gid(ctx, 1, i, &mut g) == 0 && g.raw == want
        })
        .expect("GID ::ffff:127.0.0.1");
    let pd = ibv_alloc_pd(ctx);
    let ch = ibv_create_comp_channel(ctx);
    let scq = ibv_create_cq(ctx, 16, std::ptr::null_mut(), ch, 0);
    let rcq = ibv_create_cq(ctx, 28, std::ptr::null_mut(), ch, 0);
    assert!(!pd.is_null() && !ch.is_null() && !scq.is_null() && !rcq.is_null());
    let mut qia: ibv_qp_init_attr = std::mem::zeroed();
    qia.send_cq = scq;
    qia.recv_cq = rcq;
    qia.qp_type = ibv_qp_type::IBV_QPT_RC;
    qia.cap.max_send_wr = 4;
    qia.cap.max_recv_wr = 28;
    qia.cap.max_send_sge = 1;
    qia.cap.max_recv_sge = 1;
    qia.cap.max_inline_data = 256;
    let qp = ibv_create_qp(pd, &mut qia);
    assert!(!qp.is_null() && qia.cap.max_inline_data >= 256);
    let mut buf = vec![0u8; (SLOTS + 1) * SLOT];
    let base = buf.as_mut_ptr();
    let access =
        ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    let mr = ibv_reg_mr(pd, base.cast(), buf.len(), access as i32);
    assert!(!mr.is_null());

    let mut gid: ibv_gid = std::mem::zeroed();
    assert_eq!(ibv_query_gid(ctx, 1, gid_index, &mut gid), 0);
    write_addr(rdv, role, (*qp).qp_num, &gid.raw);
    let (peer_qpn, peer_gid) = read_addr(rdv, if role == "a" { "b" } else { "a" });

    let mut a: ibv_qp_attr = std::mem::zeroed();
    a.qp_state = ibv_qp_state::IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = access | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    let m = ibv_qp_attr_mask::IBV_QP_STATE.0
        | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
        | ibv_qp_attr_mask::IBV_QP_PORT.0
        | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
    assert_eq!(ibv_modify_qp(qp, &mut a, m as i32), 0, "INIT");
    for slot in 0..SLOTS {
        post_recv(qp, mr, base, slot);
    }
    let mut a: ibv_qp_attr = std::mem::zeroed();
    a.qp_state = ibv_qp_state::IBV_QPS_RTR;
    a.path_mtu = port.active_mtu;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = peer_qpn & 0xff_ffff;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid.raw = peer_gid;
    a.ah_attr.grh.sgid_index = gid_index as u8;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    let m = ibv_qp_attr_mask::IBV_QP_STATE.0
        | ibv_qp_attr_mask::IBV_QP_AV.0
        | ibv_qp_attr_mask::IBV_QP_PATH_MTU.0
        | ibv_qp_attr_mask::IBV_QP_DEST_QPN.0
        | ibv_qp_attr_mask::IBV_QP_RQ_PSN.0
        | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
        | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0;
    assert_eq!(ibv_modify_qp(qp, &mut a, m as i32), 0, "RTR");
    let mut a: ibv_qp_attr = std::mem::zeroed();
    a.qp_state = ibv_qp_state::IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = (*qp).qp_num & 0xff_ffff;
    a.max_rd_atomic = 1;
    let m = ibv_qp_attr_mask::IBV_QP_STATE.0
        | ibv_qp_attr_mask::IBV_QP_TIMEOUT.0
        | ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0
        | ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0
        | ibv_qp_attr_mask::IBV_QP_SQ_PSN.0
        | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0;
    assert_eq!(ibv_modify_qp(qp, &mut a, m as i32), 0, "RTS");

    let tx = base.add(SLOTS * SLOT);
    if role == "a" {
        let hello = b"hello over the fabric";
        let sge = ibv_sge {
            addr: hello.as_ptr() as u64,
            length: hello.len() as u32,
            lkey: 0,
        };
        post_send(qp, sge, 1, true);
        for i in 0..SLOT {
            *tx.add(i) = (i % 251) as u8;
        }
        post_send(
            qp,
            ibv_sge {
                addr: tx as u64,
                length: SLOT as u32,
                lkey: (*mr).lkey,
            },
            2,
            false,
        );
        for id in [1, 2] {
            let wc = wait_wc(scq);
            assert_eq!(
                (wc.wr_id, wc.status),
                (id, ibv_wc_status::IBV_WC_SUCCESS),
                "send {id}"
            );
        }
        // Sleep on the completion channel for B's reply, as llama.cpp's idle poller does.
        assert_eq!(ibv_req_notify_cq(rcq, 0), 0);
        let mut wc: ibv_wc = std::mem::zeroed();
        if ibv_poll_cq(rcq, 1, &mut wc) == 0 {
            let mut pfd = libc::pollfd {
                fd: (*ch).fd,
                events: libc::POLLIN,
                revents: 0,
            };
            assert_eq!(
                libc::poll(&mut pfd, 1, 10_000),
                1,
                "channel fd never readable"
            );
            let (mut ev_cq, mut ev_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(ibv_get_cq_event(ch, &mut ev_cq, &mut ev_ctx), 0);
            assert_eq!(ev_cq, rcq);
            ibv_ack_cq_events(ev_cq, 1);
            wc = wait_wc(rcq);
        }
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (ibv_wc_status::IBV_WC_SUCCESS, ibv_wc_opcode::IBV_WC_RECV, 4)
        );
        assert_eq!(
            std::slice::from_raw_parts(base.add(wc.wr_id as usize * SLOT), 4),
            b"pong"
        );
    } else {
        let first = wait_wc(rcq);
        assert_eq!(
            (first.wr_id, first.status, first.byte_len),
            (0, ibv_wc_status::IBV_WC_SUCCESS, 21)
        );
        assert_eq!(
            std::slice::from_raw_parts(base, 21),
            b"hello over the fabric"
        );
        let second = wait_wc(rcq);
        assert_eq!(
            (second.wr_id, second.byte_len),
            (1, SLOT as u32),
            "in order, whole"
        );
        let data = std::slice::from_raw_parts(base.add(SLOT), SLOT);
        assert!(
            data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
            "payload"
        );
        std::ptr::copy_nonoverlapping(b"pong".as_ptr(), tx, 4);
        post_send(
            qp,
            ibv_sge {
                addr: tx as u64,
                length: 4,
                lkey: (*mr).lkey,
            },
            9,
            false,
        );
        let wc = wait_wc(scq);
        assert_eq!((wc.wr_id, wc.status), (9, ibv_wc_status::IBV_WC_SUCCESS));
        // Stay until A has the reply: the file appears once A is done.
        read_addr(rdv, "a-done");
    }
    if role == "a" {
        write_addr(rdv, "a-done", 0, &[0; 16]);
    }
    assert_eq!(ibv_destroy_qp(qp), 0);
    assert_eq!(ibv_dereg_mr(mr), 0);
    assert_eq!(ibv_destroy_cq(scq), 0);
    assert_eq!(ibv_destroy_cq(rcq), 0);
    assert_eq!(ibv_destroy_comp_channel(ch), 0);
    assert_eq!(ibv_dealloc_pd(pd), 0);
    assert_eq!(ibv_close_device(ctx), 0);
    drop(buf);
    std::fs::write(rdv.join(format!("{role}.ok")), b"ok").expect("marker");
}
