//! Checks at compile time that the hand-written `#[repr(C)]` verbs structs in `src/ffi.rs` have the
//! sizes and field offsets of the system's `<infiniband/verbs.h>`: a C program compiled against the
//! header prints `const` assertions that `src/ffi.rs` includes.
use std::{env, path::PathBuf, process::Command};

const CHECKS: &[(&str, &[&str])] = &[
    (
        "ibv_device",
        &[
            "node_type",
            "transport_type",
            "name",
            "dev_name",
            "dev_path",
            "ibdev_path",
        ],
    ),
    (
        "ibv_context_ops",
        &[
            "poll_cq",
            "req_notify_cq",
            "post_srq_recv",
            "post_send",
            "post_recv",
            "_compat_async_event",
        ],
    ),
    (
        "ibv_context",
        &[
            "device",
            "ops",
            "cmd_fd",
            "async_fd",
            "num_comp_vectors",
            "mutex",
            "abi_compat",
        ],
    ),
    (
        "ibv_port_attr",
        &[
            "state",
            "max_mtu",
            "active_mtu",
            "gid_tbl_len",
            "port_cap_flags",
            "max_msg_sz",
            "pkey_tbl_len",
            "lid",
            "lmc",
            "active_width",
            "active_speed",
            "phys_state",
            "link_layer",
            "flags",
            "port_cap_flags2",
        ],
    ),
    (
        "ibv_gid_entry",
        &["gid", "gid_index", "port_num", "gid_type", "ndev_ifindex"],
    ),
    ("ibv_pd", &["context", "handle"]),
    (
        "ibv_mr",
        &["context", "pd", "addr", "length", "handle", "lkey", "rkey"],
    ),
    ("ibv_comp_channel", &["context", "fd", "refcnt"]),
    (
        "ibv_cq",
        &[
            "context",
            "channel",
            "cq_context",
            "handle",
            "cqe",
            "mutex",
            "cond",
            "comp_events_completed",
            "async_events_completed",
        ],
    ),
    (
        "ibv_qp",
        &[
            "context",
            "qp_context",
            "pd",
            "send_cq",
            "recv_cq",
            "srq",
            "handle",
            "qp_num",
            "state",
            "qp_type",
            "mutex",
            "cond",
            "events_completed",
        ],
    ),
    (
        "ibv_qp_cap",
        &[
            "max_send_wr",
            "max_recv_wr",
            "max_send_sge",
            "max_recv_sge",
            "max_inline_data",
        ],
    ),
    (
        "ibv_qp_init_attr",
        &[
            "qp_context",
            "send_cq",
            "recv_cq",
            "srq",
            "cap",
            "qp_type",
            "sq_sig_all",
        ],
    ),
    (
        "ibv_global_route",
        &[
            "dgid",
            "flow_label",
            "sgid_index",
            "hop_limit",
            "traffic_class",
        ],
    ),
    (
        "ibv_ah_attr",
        &[
            "grh",
            "dlid",
            "sl",
            "src_path_bits",
            "static_rate",
            "is_global",
            "port_num",
        ],
    ),
    (
        "ibv_qp_attr",
        &[
            "qp_state",
            "cur_qp_state",
            "path_mtu",
            "path_mig_state",
            "qkey",
            "rq_psn",
            "sq_psn",
            "dest_qp_num",
            "qp_access_flags",
            "cap",
            "ah_attr",
            "alt_ah_attr",
            "pkey_index",
            "alt_pkey_index",
            "en_sqd_async_notify",
            "sq_draining",
            "max_rd_atomic",
            "max_dest_rd_atomic",
            "min_rnr_timer",
            "port_num",
            "timeout",
            "retry_cnt",
            "rnr_retry",
            "alt_port_num",
            "alt_timeout",
            "rate_limit",
        ],
    ),
    ("ibv_sge", &["addr", "length", "lkey"]),
    (
        "ibv_send_wr",
        &[
            "wr_id",
            "next",
            "sg_list",
            "num_sge",
            "opcode",
            "send_flags",
            "imm_data",
            "wr",
            "qp_type",
            "bind_mw",
        ],
    ),
    ("ibv_recv_wr", &["wr_id", "next", "sg_list", "num_sge"]),
    (
        "ibv_wc",
        &[
            "wr_id",
            "status",
            "opcode",
            "vendor_err",
            "byte_len",
            "imm_data",
            "qp_num",
            "src_qp",
            "wc_flags",
            "pkey_index",
            "slid",
            "sl",
            "dlid_path_bits",
        ],
    ),
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=/usr/include/infiniband/verbs.h");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
    for (ty, fields) in CHECKS {
        c += &format!("printf(\"const _: () = assert!(::core::mem::size_of::<{ty}>() == %zu);\\n\", sizeof(struct {ty}));\n");
        for f in *fields {
            c += &format!("printf(\"const _: () = assert!(::core::mem::offset_of!({ty}, {f}) == %zu);\\n\", offsetof(struct {ty}, {f}));\n");
        }
    }
    c += "return 0;\n}\n";
    let src = out.join("layout.c");
    let exe = out.join("layout");
    std::fs::write(&src, c).expect("write layout.c");
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run the C compiler (cc) for the verbs.h layout checks");
    assert!(
        st.success(),
        "compiling the verbs.h layout probe failed (is libibverbs-dev installed?)"
    );
    let o = Command::new(&exe).output().expect("run the layout probe");
    assert!(o.status.success());
    std::fs::write(out.join("layout_checks.rs"), o.stdout).expect("write layout_checks.rs");
}
