//! Empty library target: lets the agent's build script depend on this crate (so that a
//! change here rebuilds the embedded object) while the programs live in the binary.
#![no_std]
