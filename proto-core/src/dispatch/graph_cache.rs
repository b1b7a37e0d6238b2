//! The server's stored graphs, per device, for GRAPH_RECOMPUTE.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::PreparedGraph;
use crate::graph::Graph;
use crate::session::GRAPH_CACHE_MAX;
use crate::wire::Dialect;

/// Stored graphs of one connection.
///
/// 7.x keeps the last graph per device. 8.x keeps up to [`GRAPH_CACHE_MAX`] graphs per device by
/// uid and clears them all when full, exactly like the client's mirror; FREE_BUFFER invalidates
/// graphs but keeps 8.x entries so both sides keep counting the same entries.
///
/// Each stored graph carries the backend's [`PreparedGraph`] slot, which lives and dies with
/// it: replaced, cleared or invalidated graphs take their prepared state with them.
#[derive(Debug)]
pub struct GraphCache {
    dialect: Dialect,
    devices: HashMap<u32, HashMap<u64, Option<StoredGraph>>>,
}

/// A stored graph and what the backend prepared for it.
pub struct StoredGraph {
    /// The graph.
    pub graph: Arc<Graph>,
    /// The backend's slot (see [`crate::backend::Backend::graph_compute_stored`]).
    pub prepared: Option<PreparedGraph>,
}

impl std::fmt::Debug for StoredGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredGraph")
            .field("nodes", &self.graph.node_tensors().count())
            .field("prepared", &self.prepared.is_some())
            .finish()
    }
}

impl GraphCache {
    /// An empty cache.
    pub fn new(dialect: Dialect) -> GraphCache {
        GraphCache {
            dialect,
            devices: HashMap::new(),
        }
    }

    /// Stores a freshly computed graph (after [`GraphCache::prepare`]).
    pub fn store(
        &mut self,
        device: u32,
        uid: u64,
        graph: Arc<Graph>,
        prepared: Option<PreparedGraph>,
    ) {
        let graph = StoredGraph { graph, prepared };
        let entries = self.devices.entry(device).or_default();
        match self.dialect {
            Dialect::V7 => {
                entries.clear();
                entries.insert(0, Some(graph));
            }
            Dialect::V8 => {
                if uid != 0 {
                    entries.insert(uid, Some(graph));
                }
            }
        }
    }

    /// Applies the 8.x rule "a GRAPH_COMPUTE with a non-zero uid first clears a full device
    /// cache", before the graph is decoded, as the reference does.
    pub fn prepare(&mut self, device: u32, uid: u64) {
        if self.dialect == Dialect::V8 && uid != 0 {
            let entries = self.devices.entry(device).or_default();
            if entries.len() >= GRAPH_CACHE_MAX {
                entries.clear();
            }
        }
    }

    /// The graph to recompute (7.x ignores `uid`).
    pub fn get(&self, device: u32, uid: u64) -> Option<Arc<Graph>> {
        let key = if self.dialect == Dialect::V7 { 0 } else { uid };
        let stored = self.devices.get(&device)?.get(&key)?.as_ref()?;
        Some(stored.graph.clone())
    }

    /// The graph to recompute with its prepared state (7.x ignores `uid`).
    pub fn get_mut(&mut self, device: u32, uid: u64) -> Option<&mut StoredGraph> {
        let key = if self.dialect == Dialect::V7 { 0 } else { uid };
        self.devices.get_mut(&device)?.get_mut(&key)?.as_mut()
    }

    /// Invalidates every stored graph (their tensors may point into a freed buffer).
    pub fn invalidate_all(&mut self) {
        for entries in self.devices.values_mut() {
            match self.dialect {
                Dialect::V7 => entries.clear(),
                Dialect::V8 => entries.values_mut().for_each(|graph| *graph = None),
            }
        }
    }

    /// Number of entries (valid or invalidated) for a device.
    pub fn len(&self, device: u32) -> usize {
        self.devices.get(&device).map_or(0, HashMap::len)
    }
}
