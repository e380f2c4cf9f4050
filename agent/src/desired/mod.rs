//! The pure model of the datapath: what the maps should hold, worked out without the kernel.
//!
//! The frontends and their ordered backends (`frontend`), where each backend sits in a
//! frontend's slots (`layout`), each Maglev table (`maglev`), each source-range trie entry
//! and the order of their writes (`source_ranges`), how large the growable maps should be
//! (`sizing`), and which backends left a frontend in a sync (`gone`). Nothing here does I/O,
//! so it is tested with plain unit tests; `maps` writes it, `select` and `frontends`
//! produce it.
pub mod frontend;
pub mod gone;
pub mod layout;
pub mod maglev;
pub mod sizing;
pub mod source_ranges;

pub use self::{
    frontend::{BackendAddr, Desired, Frontend, FrontendSpec, Protocol, Scope},
    gone::Gone,
};
