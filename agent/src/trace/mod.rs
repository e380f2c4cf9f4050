//! `socklb trace`: why each connection went where it went, live. The programs write an
//! event per translation to a ring buffer while a session holds a lease on them
//! (`session`); `event` decodes and shows the events.
pub mod event;
pub mod session;
