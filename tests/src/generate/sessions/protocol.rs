//! Sessions that break the connection rules: ordering, framing, sizes, versions.

use super::*;

pub(super) fn protocol_rules(version: ProtocolVersion, out: &mut Vec<Vector>) {
    out.push(hello_caps(version));
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, version, section, description)
    };
    out.push(
        new(
            "command_before_hello",
            "§2.5 step 2",
            "DEVICE_COUNT as the first command",
        )
        .fail(&Request::DeviceCount, "hello_first"),
    );
    out.push(
        new(
            "unknown_command_before_hello",
            "§2.5 step 2",
            "An unknown command id (99) as the first frame: HELLO is checked first",
        )
        .fail_bytes(&raw_frame(99, 0, &[]), false, "hello_first"),
    );
    out.push(
        new(
            "graph_compute_before_hello",
            "§2.5 step 2",
            "The header of a huge GRAPH_COMPUTE as the first frame",
        )
        .fail_bytes(&raw_frame(10, 1 << 62, &[]), false, "hello_first"),
    );
    out.push(
        new("second_hello", "§2.5 step 7, §5.1", "HELLO twice in a row")
            .hello()
            .fail(&Request::Hello { caps: [0; 24] }, "hello_once"),
    );
    let copy = Request::RemoteCopyTensor(Box::new(proto_core::wire::RemoteCopyRequest {
        src: RpcTensor::default(),
        src_offset: 0,
        size: 0,
        n_copies: 1,
        src_stride: 0,
        dst: RpcTensor::default(),
        dst_offset: 0,
        dst_stride: 0,
        ticket: 1,
        endpoint: [0; proto_core::wire::ENDPOINT_SIZE],
    }));
    out.push(
        new(
            "remote_copy_without_extensions",
            "§2.5 step 7 (ours: ids 0xF1-0xF3)",
            "REMOTE_COPY_TENSOR (0xF3, our extension) on a connection that never sent EXTENSIONS",
        )
        .hello()
        .fail(&copy, "extension_negotiated"),
    );
    let mut s = new(
        "hello_after_commands",
        "§2.5 step 7, §5.1",
        "HELLO after other commands",
    )
    .hello();
    s.call(&Request::DeviceCount, Some(&Response::DeviceCount(1)));
    out.push(s.fail(&Request::Hello { caps: [0; 24] }, "hello_once"));

    let header_of =
        |request: &Request, keep: usize| request_frame(version, request)[..keep].to_vec();
    out.push(
        new(
            "eof_in_header",
            "§2.5 step 7",
            "The stream ends 5 bytes into a request header",
        )
        .hello()
        .fail_bytes(
            &header_of(&Request::GetAlignment { device: 0 }, 5),
            true,
            "complete_frames",
        ),
    );
    let t = t32(1, [16, 1, 1, 1], 0, 0);
    let partial = header_of(&get(&t, 0, 16), 9 + 300);
    out.push(
        new(
            "eof_in_payload",
            "§2.5 step 7",
            "The stream ends inside a GET_TENSOR payload",
        )
        .with_buffer(4096)
        .fail_bytes(&partial, true, "complete_frames"),
    );
    let write = request_frame(version, &set(&t, 0, &pattern(64, 1)));
    out.push(
        new(
            "eof_in_set_tensor_data",
            "§2.5 step 7, §5.10",
            "The stream ends after 40 of the 64 data bytes of a SET_TENSOR",
        )
        .with_buffer(4096)
        .fail_bytes(&write[..write.len() - 24], true, "complete_frames"),
    );

    let devices = |name: &str, request: Request| {
        new(
            &format!("invalid_device_{name}"),
            "§4.2",
            &format!(
                "{} naming device 1 of a server with 1 device",
                command_name(request.command())
            ),
        )
        .hello()
        .fail(&request, "device_index")
    };
    out.push(devices(
        "get_alignment",
        Request::GetAlignment { device: 1 },
    ));
    out.push(devices("get_max_size", Request::GetMaxSize { device: 1 }));
    out.push(devices(
        "get_device_memory",
        Request::GetDeviceMemory { device: 1 },
    ));
    out.push(devices(
        "alloc_buffer",
        Request::AllocBuffer {
            device: 1,
            size: 64,
        },
    ));
    out.push(devices(
        "graph_recompute",
        Request::GraphRecompute {
            device: 1,
            uid: uid(version, 5),
        },
    ));
    out.push(devices(
        "get_alloc_size",
        Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 1,
            tensor: stored(client_id(1), ty::F32, [4, 1, 1, 1], 0, 0, "t"),
            srcs: Default::default(),
        })),
    ));
    out.push(devices(
        "alloc_buffer_max",
        Request::AllocBuffer {
            device: u32::MAX,
            size: 64,
        },
    ));
    let mut graph = mini_graph(uid(version, 3));
    graph.device = 1;
    out.push(
        new(
            "invalid_device_graph_compute",
            "§4.2, §5.17 step 1",
            "GRAPH_COMPUTE on device 1 of a server with 1 device",
        )
        .with_buffer(4096)
        .fail(&compute(graph), "device_index"),
    );

    let mut s = new(
        "memory_quota",
        "G10",
        "A connection with a 1 MiB quota holds 768 KiB and asks for 512 KiB more",
    )
    .hello();
    s.server.memory_quota = Some((1u64 << 20).to_string());
    s.alloc(0, 0, 768 << 10);
    out.push(s.fail(
        &Request::AllocBuffer {
            device: 0,
            size: 512 << 10,
        },
        "memory_quota",
    ));
    let mut s = new(
        "memory_quota_after_free",
        "G10",
        "Freed bytes return to the quota; one byte over it fails",
    )
    .hello();
    s.server.memory_quota = Some((1u64 << 20).to_string());
    s.alloc(0, 0, 1 << 20);
    s.cast(&Request::FreeBuffer { buffer: buffer(0) });
    s.alloc(1, 0, 1 << 20);
    out.push(s.fail(&Request::AllocBuffer { device: 0, size: 1 }, "memory_quota"));

    out.push(new("graph_compute_too_large", "G10, §5.17", "A GRAPH_COMPUTE header declaring 2^62 bytes: refused before any payload is read (limit 256 MiB)")
        .hello()
        .fail_bytes(&raw_frame(10, 1 << 62, &[]), false, "buffered_request_limit"));
    let mut limited = new(
        "graph_compute_over_limit",
        "G10, §5.17",
        "A GRAPH_COMPUTE one byte above a 4 KiB message limit",
    )
    .hello();
    limited.server.max_message_size = 4096.to_string();
    let body = vec![0u8; 4097];
    out.push(limited.fail_bytes(&raw_frame(10, 4097, &body), false, "buffered_request_limit"));
}
