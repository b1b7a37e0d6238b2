//! Memory regions: keys and the table used to check scatter/gather entries.
use crate::ffi::{ibv_mr, ibv_sge};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

#[derive(Clone, Copy, Debug)]
pub struct MrInfo {
    pub addr: usize,
    pub len: usize,
    pub access: i32,
    pub pd: usize,
}

#[repr(C)]
pub struct Mr {
    pub ibv: ibv_mr,
}

#[derive(Default)]
pub struct MrTable {
    map: Mutex<HashMap<u32, MrInfo>>,
}

static NEXT_KEY: AtomicU32 = AtomicU32::new(0x1000);

impl MrTable {
    pub fn insert(&self, info: MrInfo) -> u32 {
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key, info);
        key
    }

    pub fn remove(&self, key: u32) -> bool {
        self.lock().remove(&key).is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, MrInfo>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The (address, length) an SGE names if it lies inside a region of `pd` registered with
    /// (at least) `need` access; `None` is a protection error.
    pub fn check(&self, sge: &ibv_sge, pd: usize, need: i32) -> Option<(usize, usize)> {
        let map = self.lock();
        let mr = map.get(&sge.lkey)?;
        let start = usize::try_from(sge.addr).ok()?;
        let end = start.checked_add(sge.length as usize)?;
        let ok = mr.pd == pd
            && (mr.access & need) == need
            && start >= mr.addr
            && end <= mr.addr + mr.len;
        ok.then_some((start, sge.length as usize))
    }
}
