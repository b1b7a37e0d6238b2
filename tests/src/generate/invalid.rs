//! Invalid frames: one frame that fails on its own, with the rule it breaks.

use bytes::Bytes;
use proto_core::wire::{
    Command, Dialect, GraphComputeRequest, ProtocolVersion, Request, RequestSize, Response,
    Tensor2dHeader,
};

use super::frames::rdma_caps;
use super::samples::{example_graph, raw_f32};
use super::{
    dialect, folder, invalid_request, invalid_response, raw_frame, raw_response, request_frame,
    spec, VERSIONS,
};
use crate::fields::command_name;
use crate::vector::Vector;

pub(super) fn generate(out: &mut Vec<Vector>) {
    for version in VERSIONS {
        requests(version, out);
        responses(version, out);
    }
}

fn filler(len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(1))
        .collect()
}

fn requests(version: ProtocolVersion, out: &mut Vec<Vector>) {
    let d = dialect(version);
    let dir = format!("invalid/frame/{}", folder(version));
    let push =
        |out: &mut Vec<Vector>, slug: &str, section: &str, description: &str, rule: &str, frame| {
            out.push(invalid_request(
                format!("{dir}/{slug}"),
                version,
                spec(section),
                description,
                rule,
                frame,
            ));
        };

    // Unknown command ids: NONE (client-internal), COUNT and beyond.
    let unknown: &[(u8, &str)] = match d {
        Dialect::V7 => &[
            (18, "id 18 (RPC_CMD_NONE in 7.0.0, never sent)"),
            (
                19,
                "id 19 (RPC_CMD_COUNT in 7.0.0; GET_TENSOR_2D only exists in 8.x)",
            ),
            (20, "id 20 (COMM_INIT only exists in 8.x)"),
            (22, "id 22 (COMM_FREE only exists in 8.x)"),
            (23, "id 23"),
            (255, "id 255"),
        ],
        Dialect::V8 => &[
            (23, "id 23 (RPC_CMD_NONE in 8.x, never sent)"),
            (
                24,
                "id 24 (RPC_CMD_COUNT in 8.x; SET_TENSOR_2D_HASH of some forks)",
            ),
            (255, "id 255"),
        ],
    };
    for &(id, what) in unknown {
        push(
            out,
            &format!("unknown_command_{id}"),
            "§2.4, §2.5 step 7",
            &format!("Unknown command {what} with an empty payload"),
            "unknown_command_id",
            raw_frame(id, 0, &[]),
        );
    }
    if d == Dialect::V7 {
        let get_2d = Request::GetTensor2d(Box::new(Tensor2dHeader {
            tensor: raw_f32(1, [8, 1, 1, 1], 0, "t"),
            offset: 0,
            size: 4,
            n_copies: 2,
            stride: 8,
        }));
        push(
            out,
            "unknown_command_get_tensor_2d",
            "§1.3, §2.5 step 7",
            "A complete 8.x GET_TENSOR_2D frame sent to a 7.0.0 server: id 19 is unknown there",
            "unknown_command_id",
            request_frame(super::V8, &get_2d),
        );
    }

    // Every fixed-size request with a size one above and one below its size.
    for command in Command::ALL.into_iter().filter(|c| c.exists_in(d)) {
        let RequestSize::Exact(size) = command.request_size(d) else {
            continue;
        };
        let name = command_name(command).to_lowercase();
        push(
            out,
            &format!("{name}_size_plus_one"),
            "§2.4, §2.5 step 8",
            &format!(
                "{} declaring {} bytes instead of exactly {size}",
                command_name(command),
                size + 1
            ),
            "fixed_request_size",
            raw_frame(command.id(), size + 1, &filler(size + 1)),
        );
        if size > 0 {
            push(
                out,
                &format!("{name}_size_minus_one"),
                "§2.4, §2.5 step 8",
                &format!(
                    "{} declaring {} bytes instead of exactly {size}",
                    command_name(command),
                    size - 1
                ),
                "fixed_request_size",
                raw_frame(command.id(), size - 1, &filler(size - 1)),
            );
        }
    }
    push(
        out,
        "hello_empty",
        "§1.5, §5.1",
        "An empty HELLO (as sent by clients older than 7.0.0): rejected, 'client needs upgrade'",
        "fixed_request_size",
        raw_frame(Command::Hello.id(), 0, &[]),
    );
    push(out, "get_alloc_size_without_sources", "§5.13",
        "GET_ALLOC_SIZE with the device and the tensor but without the 10 source records (300 bytes)",
        "fixed_request_size", raw_frame(Command::GetAllocSize.id(), 300, &filler(300)));
    match d {
        Dialect::V7 => push(
            out,
            "graph_recompute_v8_layout",
            "§1.3, §5.18",
            "An 8.x GRAPH_RECOMPUTE (device + uid, 12 bytes) sent to a 7.0.0 server",
            "fixed_request_size",
            request_frame(
                super::V8,
                &Request::GraphRecompute {
                    device: 0,
                    uid: 0x2a,
                },
            ),
        ),
        Dialect::V8 => push(
            out,
            "graph_recompute_v7_layout",
            "§1.3, §5.18",
            "A 7.0.0 GRAPH_RECOMPUTE (device only, 4 bytes) sent to an 8.x server",
            "fixed_request_size",
            request_frame(super::V7, &Request::GraphRecompute { device: 0, uid: 0 }),
        ),
    }

    // Variable-size requests below their fixed part.
    let graph_min = d.graph_header_size() as u64 + 4;
    let mut short: Vec<(String, Command, u64)> = vec![
        ("set_tensor_304".into(), Command::SetTensor, 304),
        ("set_tensor_0".into(), Command::SetTensor, 0),
        (
            format!("graph_compute_{}", graph_min - 1),
            Command::GraphCompute,
            graph_min - 1,
        ),
        ("graph_compute_0".into(), Command::GraphCompute, 0),
    ];
    if d == Dialect::V8 {
        short.push(("graph_compute_12".into(), Command::GraphCompute, 12));
        short.push(("set_tensor_2d_327".into(), Command::SetTensor2d, 327));
        short.push(("set_tensor_2d_0".into(), Command::SetTensor2d, 0));
    }
    for (slug, command, size) in short {
        let RequestSize::AtLeast(min) = command.request_size(d) else {
            unreachable!()
        };
        push(
            out,
            &format!("{slug}_too_short"),
            "§2.4, §5.10, §5.17, §5.19",
            &format!(
                "{} of {size} bytes, below its fixed part of {min} bytes",
                command_name(command)
            ),
            "variable_request_minimum",
            raw_frame(command.id(), size, &filler(size)),
        );
    }

    // GRAPH_COMPUTE counts that exceed the payload.
    let graph = example_graph(7);
    let payload = |g: &GraphComputeRequest| {
        request_frame(version, &Request::GraphCompute(Box::new(g.clone())))[9..].to_vec()
    };
    let full = payload(&graph);
    let header = d.graph_header_size();
    let n_tensors_at = header + 8 * graph.node_ids.len();
    let mut patched = |slug: &str, description: &str, at: usize, value: u32, truncate: usize| {
        let mut body = full.clone();
        body[at..at + 4].copy_from_slice(&value.to_le_bytes());
        body.truncate(body.len() - truncate);
        push(
            out,
            slug,
            "§5.17 step 2",
            description,
            "graph_counts_fit_payload",
            raw_frame(Command::GraphCompute.id(), body.len() as u64, &body),
        );
    };
    patched(
        "graph_compute_n_nodes_exceeds",
        "GRAPH_COMPUTE whose n_nodes (3) exceeds the 2 node ids present",
        header - 4,
        3,
        0,
    );
    patched(
        "graph_compute_n_nodes_max",
        "GRAPH_COMPUTE with n_nodes = 2^32 - 1",
        header - 4,
        u32::MAX,
        0,
    );
    patched(
        "graph_compute_n_tensors_exceeds",
        "GRAPH_COMPUTE whose n_tensors (6) exceeds the 5 records present",
        n_tensors_at,
        6,
        0,
    );
    patched(
        "graph_compute_n_tensors_max",
        "GRAPH_COMPUTE with n_tensors = 2^32 - 1",
        n_tensors_at,
        u32::MAX,
        0,
    );
    patched(
        "graph_compute_record_truncated",
        "GRAPH_COMPUTE whose last tensor record lacks its last byte",
        n_tensors_at,
        5,
        1,
    );
    let mut no_count = full[..n_tensors_at].to_vec();
    no_count.extend_from_slice(&[5, 0]);
    push(
        out,
        "graph_compute_n_tensors_missing",
        "§5.17 step 2",
        "GRAPH_COMPUTE that ends inside its n_tensors field",
        "graph_counts_fit_payload",
        raw_frame(Command::GraphCompute.id(), no_count.len() as u64, &no_count),
    );
    let (other, other_version) = match d {
        Dialect::V7 => ("v8", super::V8),
        Dialect::V8 => ("v7", super::V7),
    };
    push(out, &format!("graph_compute_{other}_layout"), "§1.3, §5.17",
        &format!("A {other_version} GRAPH_COMPUTE: the other header layout makes the counts exceed the payload"),
        "graph_counts_fit_payload",
        request_frame(other_version, &Request::GraphCompute(Box::new(example_graph(0x2a)))));

    if d == Dialect::V8 {
        tensor_2d(version, &dir, out);
    }
}

fn tensor_2d(version: ProtocolVersion, dir: &str, out: &mut Vec<Vector>) {
    let tensor = raw_f32(1, [8, 4, 1, 1], 0x100, "t");
    let header = |size, n_copies| Tensor2dHeader {
        tensor: tensor.clone(),
        offset: 0,
        size,
        n_copies,
        stride: 32,
    };
    let set = |h: Tensor2dHeader, data: &[u8]| {
        let mut body = request_frame(version, &Request::GetTensor2d(Box::new(h)))[9..].to_vec();
        body.extend_from_slice(data);
        raw_frame(Command::SetTensor2d.id(), body.len() as u64, &body)
    };
    let get = |h: Tensor2dHeader| request_frame(version, &Request::GetTensor2d(Box::new(h)));
    let cases: Vec<(&str, &str, &str, Vec<u8>)> = vec![
        (
            "set_tensor_2d_data_too_long",
            "SET_TENSOR_2D of 3 rows of 8 bytes carrying 25 data bytes",
            "set_tensor_2d_data_length",
            set(header(8, 3), &filler(25)),
        ),
        (
            "set_tensor_2d_data_too_short",
            "SET_TENSOR_2D of 3 rows of 8 bytes carrying 23 data bytes",
            "set_tensor_2d_data_length",
            set(header(8, 3), &filler(23)),
        ),
        (
            "set_tensor_2d_no_data",
            "SET_TENSOR_2D of 2 rows of 4 bytes carrying no data",
            "set_tensor_2d_data_length",
            set(header(4, 2), &[]),
        ),
        (
            "set_tensor_2d_size_zero",
            "SET_TENSOR_2D with size 0 (and no data)",
            "tensor_2d_nonzero",
            set(header(0, 3), &[]),
        ),
        (
            "set_tensor_2d_n_copies_zero",
            "SET_TENSOR_2D with n_copies 0 (and no data)",
            "tensor_2d_nonzero",
            set(header(8, 0), &[]),
        ),
        (
            "set_tensor_2d_length_overflow",
            "SET_TENSOR_2D with size 2^63 and n_copies 2: size·n_copies wraps to 0",
            "set_tensor_2d_data_length",
            set(header(1 << 63, 2), &[]),
        ),
        (
            "get_tensor_2d_size_zero",
            "GET_TENSOR_2D with size 0",
            "tensor_2d_nonzero",
            get(header(0, 3)),
        ),
        (
            "get_tensor_2d_n_copies_zero",
            "GET_TENSOR_2D with n_copies 0",
            "tensor_2d_nonzero",
            get(header(8, 0)),
        ),
        (
            "get_tensor_2d_length_overflow",
            "GET_TENSOR_2D with size 2^32 and n_copies 2^32: size·n_copies overflows",
            "tensor_2d_length_fits",
            get(header(1 << 32, 1 << 32)),
        ),
    ];
    for (slug, description, rule, frame) in cases {
        out.push(invalid_request(
            format!("{dir}/{slug}"),
            version,
            spec("§5.19, §5.20"),
            description,
            rule,
            frame,
        ));
    }
}

fn responses(version: ProtocolVersion, out: &mut Vec<Vector>) {
    let d = dialect(version);
    let dir = format!("invalid/frame/{}/responses", folder(version));
    let push = |out: &mut Vec<Vector>,
                slug: &str,
                section: &str,
                description: &str,
                rule: &str,
                request: &Request,
                frame| {
        out.push(invalid_response(
            format!("{dir}/{slug}"),
            version,
            spec(section),
            description,
            rule,
            request,
            frame,
        ));
    };
    let tensor = raw_f32(1, [8, 4, 1, 1], 0x100, "t");
    let fixed: Vec<Request> = vec![
        Request::Hello { caps: [0; 24] },
        Request::DeviceCount,
        Request::AllocBuffer {
            device: 0,
            size: 4096,
        },
        Request::GetAlignment { device: 0 },
        Request::GetMaxSize { device: 0 },
        Request::BufferGetBase {
            buffer: super::samples::RAW_BUFFER,
        },
        Request::SetTensorHash {
            tensor: Box::new(tensor.clone()),
            offset: 0,
            hash: 1,
        },
        Request::CopyTensor {
            src: Box::new(tensor.clone()),
            dst: Box::new(tensor.clone()),
        },
        Request::GetDeviceMemory { device: 0 },
        Request::GetAllocSize(Box::new(proto_core::wire::AllocSizeRequest {
            device: 0,
            tensor: tensor.clone(),
            srcs: Default::default(),
        })),
    ]
    .into_iter()
    .chain((d == Dialect::V8).then(|| {
        Request::CommInit(Box::new(proto_core::wire::CommInitRequest {
            device: 0,
            rank: 0,
            world: 2,
            port: 51052,
            host: [0; 64],
        }))
    }))
    .collect();
    for request in &fixed {
        let command = request.command();
        let size = command.fixed_response_size().expect("fixed response");
        let name = command_name(command).to_lowercase();
        push(
            out,
            &format!("{name}_plus_one"),
            "§2.3",
            &format!(
                "{} response of {} bytes instead of {size}",
                command_name(command),
                size + 1
            ),
            "response_size",
            request,
            raw_response(&filler(size + 1)),
        );
        push(
            out,
            &format!("{name}_minus_one"),
            "§2.3",
            &format!(
                "{} response of {} bytes instead of {size}",
                command_name(command),
                size - 1
            ),
            "response_size",
            request,
            raw_response(&filler(size - 1)),
        );
    }
    let mut fork = vec![version.major, version.minor, version.patch, 0];
    fork.extend_from_slice(&[0; 24]);
    fork.extend_from_slice(&51052u16.to_le_bytes());
    fork.extend_from_slice(&[0; 64]);
    push(out, "hello_fork_94_bytes", "§0, §1.5",
        "A fork's 94-byte HELLO response (comm_port and comm_host appended): not upstream, rejected",
        "response_size", &Request::Hello { caps: [0; 24] }, raw_response(&fork));
    let get = Request::GetTensor {
        tensor: Box::new(tensor.clone()),
        offset: 0,
        size: 16,
    };
    push(
        out,
        "get_tensor_shorter",
        "§5.12, §2.3",
        "GET_TENSOR of 16 bytes answered with 12 bytes",
        "response_size",
        &get,
        raw_response(&filler(12)),
    );
    push(
        out,
        "get_tensor_longer",
        "§5.12, §2.3",
        "GET_TENSOR of 16 bytes answered with 17 bytes",
        "response_size",
        &get,
        raw_response(&filler(17)),
    );
    push(
        out,
        "get_tensor_empty",
        "§5.12, §2.3",
        "GET_TENSOR of 16 bytes answered with an empty payload",
        "response_size",
        &get,
        raw_response(&[]),
    );
    if d == Dialect::V8 {
        let get_2d = Request::GetTensor2d(Box::new(Tensor2dHeader {
            tensor: tensor.clone(),
            offset: 0,
            size: 8,
            n_copies: 3,
            stride: 32,
        }));
        push(out, "get_tensor_2d_one_row", "§5.20, §2.3",
            "GET_TENSOR_2D of 3 rows of 8 bytes answered with one row (size instead of size·n_copies)",
            "response_size", &get_2d, raw_response(&filler(8)));
    }

    // The client's version rule.
    let hello = Request::Hello { caps: [0; 24] };
    let mismatches: Vec<(u8, u8, u8, &str)> = match d {
        Dialect::V7 => vec![
            (
                8,
                0,
                0,
                "an 8.0.0 server answering a 7.0.0 client (other major)",
            ),
            (
                7,
                1,
                0,
                "a 7.1.0 server answering a 7.0.0 client (higher minor)",
            ),
            (
                6,
                0,
                0,
                "a 6.0.0 server answering a 7.0.0 client (other major)",
            ),
        ],
        Dialect::V8 => vec![
            (
                7,
                0,
                0,
                "a 7.0.0 server answering an 8.0.0 client (other major)",
            ),
            (
                8,
                1,
                0,
                "an 8.1.0 server answering an 8.0.0 client (higher minor)",
            ),
            (
                9,
                0,
                0,
                "a 9.0.0 server answering an 8.0.0 client (other major)",
            ),
        ],
    };
    for (major, minor, patch, description) in mismatches {
        let response = Response::Hello {
            version: ProtocolVersion {
                major,
                minor,
                patch,
            },
            flags: 0,
            caps: rdma_caps(),
        };
        push(
            out,
            &format!("hello_version_{major}_{minor}_{patch}"),
            "§1.5",
            &format!("HELLO response of {description}"),
            "hello_version",
            &hello,
            response.to_frame().to_vec(),
        );
    }

    // Bytes nobody asked for.
    push(
        out,
        "unsolicited_after_free_buffer",
        "§2.3, §2.4",
        "An empty response frame after FREE_BUFFER, which has no response",
        "unsolicited_response",
        &Request::FreeBuffer {
            buffer: super::samples::RAW_BUFFER,
        },
        raw_response(&[]),
    );
    let set = Request::SetTensor {
        header: Box::new(proto_core::wire::SetTensorHeader {
            tensor,
            cache_flag: 0,
            offset: 0,
        }),
        data: Bytes::from_static(&[1, 2, 3, 4]),
    };
    push(
        out,
        "unsolicited_after_set_tensor",
        "§2.3, §2.4",
        "A 1-byte response after SET_TENSOR, which has no response",
        "unsolicited_response",
        &set,
        raw_response(&[1]),
    );
}
