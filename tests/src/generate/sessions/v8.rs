//! Sessions of the 8.x dialect only: graph uids, the 2D tensor commands, the comm link.

use super::*;

pub(super) fn v8_only(out: &mut Vec<Vector>) {
    let version = super::super::V8;
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, version, section, description)
    };
    let t = t32(1, [16, 1, 1, 1], 0, 0);
    let fail = |name: &str, section: &str, description: &str, request: Request, rule: &str| {
        new(name, section, description)
            .with_buffer(4096)
            .fail(&request, rule)
    };
    let mut s = new(
        "recompute_unknown_uid",
        "§5.18",
        "GRAPH_COMPUTE of uid 0x77, GRAPH_RECOMPUTE of uid 0x78",
    )
    .with_buffer(4096);
    s.cast(&compute(mini_graph(0x77)));
    out.push(s.fail(
        &Request::GraphRecompute {
            device: 0,
            uid: 0x78,
        },
        "stored_graph",
    ));
    let mut s = new(
        "recompute_uid_zero",
        "§5.17 step 3, §5.18",
        "GRAPH_COMPUTE with uid 0 is not cached: GRAPH_RECOMPUTE of uid 0 fails",
    )
    .with_buffer(4096);
    s.cast(&compute(mini_graph(0)));
    out.push(s.fail(
        &Request::GraphRecompute { device: 0, uid: 0 },
        "stored_graph",
    ));

    out.push(fail(
        "set_tensor_2d_no_buffer",
        "§5.19",
        "SET_TENSOR_2D into a tensor with buffer 0",
        Request::SetTensor2d {
            header: rows(
                &{
                    let mut h = t.clone();
                    h.buffer = 0;
                    h.data = 0;
                    h
                },
                0,
                4,
                2,
                8,
            ),
            data: Bytes::from(vec![1u8; 8]),
        },
        "tensor_needs_buffer",
    ));
    out.push(fail(
        "set_tensor_2d_rows_past_tensor",
        "§5.19",
        "SET_TENSOR_2D whose last row (offset 8 + 3·24) ends past the 64-byte tensor",
        Request::SetTensor2d {
            header: rows(&t, 8, 8, 4, 24),
            data: Bytes::from(vec![1u8; 32]),
        },
        "region_inside_tensor",
    ));
    out.push(fail(
        "get_tensor_2d_rows_past_tensor",
        "§5.20",
        "GET_TENSOR_2D of 2 rows of 8 bytes, stride 60, in a 64-byte tensor",
        Request::GetTensor2d(rows(&t, 0, 8, 2, 60)),
        "region_inside_tensor",
    ));
    out.push(fail("get_tensor_2d_past_buffer_end", "§5.20", "GET_TENSOR_2D of one byte at offset 17 of a 16-byte tensor that ends with its buffer: the row starts past the buffer",
        Request::GetTensor2d(rows(&t32(2, [4, 1, 1, 1], 0, 4080), 17, 1, 1, 0)), "region_inside_buffer"));
    out.push(fail(
        "get_tensor_2d_stride_overflow",
        "§5.20, G5",
        "GET_TENSOR_2D with stride 2^64 - 1: (n_copies - 1)·stride + size overflows",
        Request::GetTensor2d(rows(&t, 0, 8, 2, u64::MAX)),
        "address_arithmetic",
    ));
    out.push(fail(
        "set_tensor_2d_stride_overflow",
        "§5.19, G5",
        "SET_TENSOR_2D with 2 rows of 4 bytes and stride 2^64 - 2: the span overflows",
        Request::SetTensor2d {
            header: rows(&t, 0, 4, 2, u64::MAX - 1),
            data: Bytes::from(vec![1u8; 8]),
        },
        "address_arithmetic",
    ));
    let mut frame = request_frame(
        version,
        &Request::GetTensor2d(rows(&t, 0, (1 << 62) - 328, 1, 0)),
    );
    frame[0] = Command::SetTensor2d.id();
    frame[1..9].copy_from_slice(&(1u64 << 62).to_le_bytes());
    out.push(new("set_tensor_2d_huge_length", "G10, §5.19", "A SET_TENSOR_2D header declaring 2^62 bytes (one row of 2^62 - 328 bytes): refused before any data")
        .with_buffer(4096)
        .fail_bytes(&frame, false, "streamed_length"));
    out.push(fail(
        "comm_free_invalid_device",
        "§5.23",
        "COMM_FREE of device 1 of a server with 1 device",
        Request::CommFree { device: 1 },
        "device_index",
    ));
    out.push(fail(
        "comm_allreduce_invalid_device",
        "§5.22",
        "COMM_ALLREDUCE on device 1 of a server with 1 device",
        Request::CommAllreduce {
            device: 1,
            tensor: Box::new(t.clone()),
        },
        "device_index",
    ));
    let mut compute_flag = t.clone();
    compute_flag.flags = flags::COMPUTE;
    out.push(fail(
        "comm_allreduce_without_comm_init",
        "§5.22",
        "COMM_ALLREDUCE on a device without a communicator",
        Request::CommAllreduce {
            device: 0,
            tensor: Box::new(compute_flag.clone()),
        },
        "communicator_required",
    ));
    let mut s = new(
        "comm_allreduce_after_failed_comm_init",
        "§5.21, §5.22",
        "COMM_INIT with world 1 answers 0; COMM_ALLREDUCE then has no communicator",
    )
    .with_buffer(4096);
    s.call(
        &Request::CommInit(Box::new(CommInitRequest {
            device: 0,
            rank: 0,
            world: 1,
            port: 51052,
            host: [0; 64],
        })),
        Some(&Response::CommInit(0)),
    );
    out.push(s.fail(
        &Request::CommAllreduce {
            device: 0,
            tensor: Box::new(compute_flag),
        },
        "communicator_required",
    ));

    // The tensor cache (HELLO flag bit 0).
    let content = pattern(256, 7);
    let hash = fnv1a64(&content);
    let cached = |name: &str, description: &str| {
        let mut s = new(name, "§5.11, §1.4", description);
        s.server.tensor_cache = true;
        s.with_buffer(4096)
    };
    let weight = t32(3, [64, 1, 1, 1], 0, 256);
    let mut s = cached("tensor_cache", "A server with a tensor cache: HELLO flags 1, SET_TENSOR_HASH miss (0), SET_TENSOR with cache_flag 1, BUFFER_CLEAR, SET_TENSOR_HASH hit (1) restores the data");
    s.call(
        &Request::SetTensorHash {
            tensor: Box::new(weight.clone()),
            offset: 0,
            hash,
        },
        Some(&Response::SetTensorHash(0)),
    );
    s.cast(&Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: weight.clone(),
            cache_flag: 1,
            offset: 0,
        }),
        data: Bytes::from(content.clone()),
    });
    s.cast(&Request::BufferClear {
        buffer: buffer(0),
        value: 0,
    });
    s.call(
        &Request::SetTensorHash {
            tensor: Box::new(weight.clone()),
            offset: 0,
            hash,
        },
        Some(&Response::SetTensorHash(1)),
    );
    s.call(&get(&weight, 0, 256), Some(&data(&content)));
    s.call(
        &Request::SetTensorHash {
            tensor: Box::new(weight.clone()),
            offset: 0,
            hash: hash ^ 1,
        },
        Some(&Response::SetTensorHash(0)),
    );
    out.push(s.done());
    let mut s = cached("tensor_cache_hit_past_tensor", "SET_TENSOR_HASH hit whose cached data (256 bytes) would be written at offset 16 of a 256-byte tensor (G4)");
    s.cast(&Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: weight.clone(),
            cache_flag: 1,
            offset: 0,
        }),
        data: Bytes::from(content),
    });
    out.push(s.fail(
        &Request::SetTensorHash {
            tensor: Box::new(weight),
            offset: 16,
            hash,
        },
        "region_inside_tensor",
    ));
}
