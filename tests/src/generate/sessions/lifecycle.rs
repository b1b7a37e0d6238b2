//! The valid sessions: a server's whole life cycle (every command once, in order) and HELLO's
//! transport caps.

use super::*;

pub(super) fn lifecycle(version: ProtocolVersion) -> Vector {
    let v8 = dialect(version) == Dialect::V8;
    let mut s = Session::new(
        "lifecycle",
        version,
        "§5, §7",
        "A whole connection against 2 devices of 1 GiB: queries, buffers (including a zero-size \
         buffer and a failed allocation), writes, reads, memset (an empty one at the very end of \
         the buffer), copy, clear, INIT_TENSOR, GET_ALLOC_SIZE (whose source names an unknown \
         handle), SET_TENSOR_HASH without a cache (answers 0 without looking at the tensor), \
         GRAPH_COMPUTE / GRAPH_RECOMPUTE, FREE_BUFFER; 8.x adds the 2D commands and COMM_INIT \
         with bad arguments (answers 0)",
    )
    .devices(2)
    .hello();
    s.call(&Request::DeviceCount, Some(&Response::DeviceCount(2)));
    s.call(
        &Request::GetDeviceMemory { device: 0 },
        Some(&Response::DeviceMemory {
            free: GIB,
            total: GIB,
        }),
    );
    s.call(
        &Request::GetAlignment { device: 1 },
        Some(&Response::Alignment(32)),
    );
    s.call(
        &Request::GetMaxSize { device: 0 },
        Some(&Response::MaxSize(GIB)),
    );
    s.alloc(0, 0, 4096);
    s.call(
        &Request::GetDeviceMemory { device: 0 },
        Some(&Response::DeviceMemory {
            free: GIB - 4096,
            total: GIB,
        }),
    );
    s.alloc(1, 1, 0);
    s.call(
        &Request::AllocBuffer {
            device: 1,
            size: 2 * GIB,
        },
        Some(&Response::AllocBuffer {
            remote_ptr: 0,
            remote_size: 0,
        }),
    );
    let a = t32(1, [16, 1, 1, 1], 0, 0);
    let b = t32(2, [16, 1, 1, 1], 0, 64);
    let content = pattern(64, 3);
    s.cast(&set(&a, 0, &content));
    s.call(&get(&a, 8, 16), Some(&data(&content[8..24])));
    s.call(&get(&a, 64, 0), Some(&data(&[])));
    s.cast(&Request::MemsetTensor {
        tensor: Box::new(a.clone()),
        offset: 0,
        size: 8,
        value: 0xee,
    });
    let mut expected = content.clone();
    expected[..8].fill(0xee);
    s.call(&get(&a, 0, 16), Some(&data(&expected[..16])));
    s.call(
        &Request::CopyTensor {
            src: Box::new(a.clone()),
            dst: Box::new(b.clone()),
        },
        Some(&Response::CopyTensor(1)),
    );
    s.call(&get(&b, 0, 64), Some(&data(&expected)));
    s.cast(&set(&b, 64, &[]));
    let end = t32(3, [4, 1, 1, 1], 0, 4080);
    s.cast(&Request::MemsetTensor {
        tensor: Box::new(end.clone()),
        offset: 16,
        size: 0,
        value: 1,
    });
    s.cast(&Request::InitTensor {
        tensor: Box::new(a.clone()),
    });
    let mut node = stored(client_id(20), ty::F32, [8, 2, 1, 1], 0, 0, "node");
    node.op = Op::MUL_MAT.0;
    let mut srcs: [RpcTensor; 10] = Default::default();
    srcs[0] = stored(
        client_id(21),
        ty::Q8_0,
        [64, 8, 1, 1],
        0x0000_5581_2e4a_b000,
        0x0000_7f1c_2000_0000,
        "w",
    );
    node.src[0] = srcs[0].id;
    s.call(
        &Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 1,
            tensor: node.clone(),
            srcs: srcs.clone(),
        })),
        Some(&Response::AllocSize(64)),
    );
    // The tensor itself may name a buffer of another server: "no buffer", default buffer type.
    let mut foreign = node;
    foreign.buffer = 0x0000_5581_2e4a_c2a0;
    foreign.data = 0x0000_7f1c_6000_0000;
    s.call(
        &Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: foreign,
            srcs,
        })),
        Some(&Response::AllocSize(64)),
    );
    s.call(
        &Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: b.clone(),
            srcs: Default::default(),
        })),
        Some(&Response::AllocSize(64)),
    );
    let mut garbage = a.clone();
    garbage.type_id = 4;
    s.call(
        &Request::SetTensorHash {
            tensor: Box::new(garbage),
            offset: 0,
            hash: fnv1a64(&content),
        },
        Some(&Response::SetTensorHash(0)),
    );
    s.cast(&Request::BufferClear {
        buffer: buffer(0),
        value: 0x11,
    });
    s.call(&get(&a, 0, 4), Some(&data(&[0x11; 4])));
    s.cast(&Request::BufferClear {
        buffer: buffer(1),
        value: 0xff,
    });
    s.cast(&compute(mini_graph(uid(version, 0x77))));
    s.cast(&Request::GraphRecompute {
        device: 0,
        uid: uid(version, 0x77),
    });
    // A node without the COMPUTE flag is never executed and needs no storage.
    let mut skipped = mini_graph(uid(version, 0x78));
    let mut reshape = stored(client_id(30), ty::F32, [8, 1, 1, 1], 0, 0, "reshaped");
    reshape.op = Op::RESHAPE.0;
    reshape.src[0] = skipped.tensors[5].id;
    skipped.node_ids.push(reshape.id);
    skipped.tensors.push(reshape);
    s.cast(&compute(skipped));
    if v8 {
        // 8.x skips the bounds check of tensors without elements.
        let mut empty = t32(31, [0, 4, 1, 1], 0, 8192);
        empty.nb = [4, 0, 0, 0];
        s.cast(&Request::InitTensor {
            tensor: Box::new(empty),
        });
        s.cast(&compute(mini_graph(0)));
        s.cast(&Request::GraphRecompute {
            device: 0,
            uid: 0x77,
        });
        s.cast(&Request::SetTensor2d {
            header: rows(&a, 4, 4, 3, 16),
            data: Bytes::from(vec![7u8; 12]),
        });
        s.call(
            &Request::GetTensor2d(rows(&a, 0, 8, 2, 16)),
            Some(&Response::Tensor2dData(Bytes::from_static(&[
                0x11, 0x11, 0x11, 0x11, 7, 7, 7, 7, 0x11, 0x11, 0x11, 0x11, 7, 7, 7, 7,
            ]))),
        );
        s.cast(&Request::SetTensor2d {
            header: rows(&end, 12, 4, 2, 0),
            data: Bytes::from(vec![9u8; 8]),
        });
        s.call(
            &Request::GetTensor2d(rows(&end, 8, 8, 1, 0)),
            Some(&Response::Tensor2dData(Bytes::from_static(&[
                0x11, 0x11, 0x11, 0x11, 9, 9, 9, 9,
            ]))),
        );
        for (device, rank, world) in [(2, 0, 2), (0, 2, 2), (0, 0, 1)] {
            let request = CommInitRequest {
                device,
                rank,
                world,
                port: 51052,
                host: [0; 64],
            };
            s.call(
                &Request::CommInit(Box::new(request)),
                Some(&Response::CommInit(0)),
            );
        }
        s.cast(&Request::CommFree { device: 1 });
    }
    s.cast(&Request::FreeBuffer { buffer: buffer(1) });
    s.cast(&Request::FreeBuffer { buffer: buffer(0) });
    s.call(
        &Request::GetDeviceMemory { device: 0 },
        Some(&Response::DeviceMemory {
            free: GIB,
            total: GIB,
        }),
    );
    s.done()
}

/// HELLO with RDMA caps on both sides: the server answers its own caps whatever the client sent.
pub(super) fn hello_caps(version: ProtocolVersion) -> Vector {
    let client = super::super::frames::rdma_caps();
    let mut server = client;
    server[0..8].copy_from_slice(&[0x11, 0x0e, 0, 0, 0x11, 0x0e, 0, 0]);
    server[23] = 20;
    let mut s = Session::new("hello_caps", version, "§5.1, §10.2",
        "HELLO with RoCE caps from the client, answered with the server's own caps; then DEVICE_COUNT");
    s.server.conn_caps = hex::encode(&server);
    s.call(
        &Request::Hello { caps: client },
        Some(&Response::Hello {
            version,
            flags: 0,
            caps: server,
        }),
    );
    s.call(&Request::DeviceCount, Some(&Response::DeviceCount(1)));
    s.done()
}
