//! Starting the datapath: load the programs over the pinned maps and hand each map to its
//! writer, then (once the maps are programmed) attach the programs.
use std::{borrow::Cow, path::Path};

use aya::{
    Ebpf,
    maps::{Array, MapData},
};
use socklb_abi::map_names;
use tracing::{debug, info, warn};

use super::{Dataplane, config::Config, error::DataplaneError, growth::capacity};
use crate::{
    desired::Desired,
    kernel::{
        attach::{
            Attachment, cgroup,
            tc::{self, TcAttached, TcDevice, TcMode},
        },
        carry,
        destroy::{self, DestroyPrograms, Unavailable as DestroyUnavailable},
        flow_filter, host,
        load::{self, take_map},
        mapped_words::MappedWords,
        object,
        program_logs::ProgramLogs,
    },
    maps::{
        frontend_filter::FrontendFilter,
        maglev::MaglevWriter,
        mirror::MirrorWriter,
        names::NamesWriter,
        services::{self, KernelMaps, RawMaps},
        source_ranges::SourceRangeWriter,
        writer::{ApplyReport, Writer},
    },
};

impl Dataplane {
    /// Loads the programs and adopts (or creates) the pinned maps. Nothing is attached: call
    /// [`Self::apply`] first and then [`Self::attach`], so that the programs never run
    /// against maps that are not programmed yet.
    pub fn load(config: Config) -> Result<Self, DataplaneError> {
        // Resolved and checked now, so that a bad path fails before anything is touched.
        let cgroup = match &config.cgroup {
            Some(path) => path.clone(),
            None => host::cgroup2_mount()?,
        };
        host::check_cgroup2(&cgroup)?;
        let pin_dir_existed = config.pin_dir.exists();
        host::prepare_pin_dir(&config.pin_dir)?;
        let kfunc = destroy::kfunc_id();
        let (object, kfunc) =
            match destroy::patch_kfunc_call(object::OBJECT, kfunc.as_ref().ok().map(|(_, id)| *id))
            {
                Ok(object) => (object, kfunc),
                Err(error) => (Cow::Borrowed(object::OBJECT), Err(error)),
            };
        let load::Loaded {
            mut ebpf,
            replaced_masters,
            sizes,
            programs_loaded,
        } = load::load(
            &config.pin_dir,
            &config.capacities,
            config.program_settings(),
            &object,
            config.program_load,
        )
        .map_err(|error| {
            // The loader unpinned its maps; the directory goes too if this load made it.
            if !pin_dir_existed {
                let _ = std::fs::remove_dir(&config.pin_dir);
            }
            DataplaneError::from(error).explain_refusal()
        })?;
        carry_over(&config.pin_dir, "at load");
        // Before any program of this load runs; until the seed, every packet is looked up.
        flow_filter::distrust(&config.pin_dir)?;
        let mut kernel_maps = KernelMaps::new(RawMaps {
            services: take_map(&mut ebpf, map_names::SERVICES)?,
            slots: MappedWords::open_array(
                take_map(&mut ebpf, map_names::SLOTS)?,
                map_names::SLOTS,
            )?,
            backends: take_map(&mut ebpf, map_names::BACKENDS)?,
            services6: take_map(&mut ebpf, map_names::SERVICES6)?,
            backends6: take_map(&mut ebpf, map_names::BACKENDS6)?,
            frontend_filter: FrontendFilter::open(&config.pin_dir)?,
        })
        .map_err(DataplaneError::map(map_names::SERVICES))?;
        let counters = take_map(&mut ebpf, map_names::COUNTERS)?
            .try_into()
            .map_err(DataplaneError::map(map_names::COUNTERS))?;
        let socket_records = take_map(&mut ebpf, map_names::SOCKET_RECORD_COUNT)?
            .try_into()
            .map_err(DataplaneError::map(map_names::SOCKET_RECORD_COUNT))?;
        let source_ranges = SourceRangeWriter::adopt(
            take_trie(&mut ebpf, map_names::SOURCE_RANGES)?,
            take_trie(&mut ebpf, map_names::SOURCE_RANGES6)?,
            config.capacities.source_ranges,
        )
        .map_err(DataplaneError::map(map_names::SOURCE_RANGES))?;
        let maglev = take_map(&mut ebpf, map_names::MAGLEV)?
            .try_into()
            .and_then(|map| MaglevWriter::adopt(map, config.maglev_table_size))
            .map_err(DataplaneError::map(map_names::MAGLEV))?;
        let names = take_map(&mut ebpf, map_names::NAMES)?
            .try_into()
            .and_then(NamesWriter::adopt)
            .map_err(DataplaneError::map(map_names::NAMES))?;
        let namespaces = take_map(&mut ebpf, map_names::SOCKET_LB_NAMESPACES)?
            .try_into()
            .and_then(MirrorWriter::adopt)
            .map_err(DataplaneError::map(map_names::SOCKET_LB_NAMESPACES))?;
        let pod_devices = take_map(&mut ebpf, map_names::POD_DEVICES)?
            .try_into()
            .and_then(MirrorWriter::adopt)
            .map_err(DataplaneError::map(map_names::POD_DEVICES))?;
        let node = take_map(&mut ebpf, map_names::NODE)?
            .try_into()
            .map_err(DataplaneError::map(map_names::NODE))?;
        let node6 = ebpf
            .take_map(map_names::NODE6)
            .map(Array::try_from)
            .transpose()
            .map_err(DataplaneError::map(map_names::NODE6))?;
        let contents = kernel_maps
            .read()
            .map_err(DataplaneError::map(map_names::SERVICES))?;
        let destroy = kfunc.and_then(|(btf, _)| destroy::load(&mut ebpf, &btf));
        let adopted = contents.services.len();
        let mut writer = Writer::adopt(kernel_maps, capacity(&sizes), contents);
        writer.prefer(
            replaced_masters
                .iter()
                .filter_map(|key| Some(services::decode_key(key)?.frontend)),
        );
        info!(
            pin_dir = %config.pin_dir.display(),
            adopted_service_entries = adopted,
            sizes = %sizes,
            "datapath loaded"
        );
        Ok(Self {
            ebpf,
            writer,
            source_ranges,
            maglev,
            names,
            namespaces,
            pod_devices,
            counters,
            socket_records,
            node,
            netns_cookie: super::netns_cookie().unwrap_or(0),
            node6,
            cgroup,
            config,
            sizes,
            growth_retry_at: None,
            object,
            destroy: Some(destroy),
            unswept: Vec::new(),
            programs_loaded,
        })
    }

    /// The first full sync, [`Self::apply`] on a node whose programs are not loaded yet
    /// ([`Config::program_load`] deferred them on this fresh node): grows the maps to hold
    /// `desired`, then writes them while the kernel verifies the programs over those maps,
    /// once: the verifier's 0.6-0.9 s (2 CPUs) hides behind the writes of a large cluster.
    ///
    /// The outer error is the kernel refusing the programs: the start fails, and the maps
    /// this agent pinned are unpinned again. The inner one is the sync's, retried as any
    /// other.
    pub fn apply_first(
        &mut self,
        desired: &Desired<'_>,
    ) -> Result<Result<ApplyReport, DataplaneError>, DataplaneError> {
        if self.programs_loaded {
            // A restart: the mirror was adopted from the maps at load.
            return Ok(self.apply(desired));
        }
        // A growth here replaces the maps; the programs are loaded over the new ones below.
        self.make_room_for(desired);
        let before = self.internal_backends(self.writer.frontends());
        let (ebpf, writer) = (&mut self.ebpf, &mut self.writer);
        let (result, loaded) = std::thread::scope(|scope| {
            let verifying = scope.spawn(|| load::load_programs(ebpf));
            // No program reads these maps yet (they are new: the programs wait for them).
            writer.store_mut().hold_writes();
            let result = writer.apply(desired);
            let held = writer.store_mut().write_held();
            let result = result.and_then(|report| held.map(|()| report));
            let loaded = verifying
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (result, loaded)
        });
        if let Err(error) = loaded {
            load::unpin_maps(&self.config.pin_dir);
            return Err(DataplaneError::from(error).explain_refusal());
        }
        self.programs_loaded = true;
        Ok(self.apply_after_writer(desired, result, &before))
    }

    /// Has the kernel verify the programs, unless it did already.
    fn load_programs(&mut self) -> Result<(), DataplaneError> {
        if !self.programs_loaded {
            load::load_programs(&mut self.ebpf)
                .map_err(|error| DataplaneError::from(error).explain_refusal())?;
            self.programs_loaded = true;
        }
        Ok(())
    }

    /// The reader of the programs' log lines, taken once (`None` when logging is off).
    pub fn program_logs(&mut self) -> Result<Option<ProgramLogs>, DataplaneError> {
        Ok(ProgramLogs::take(
            &mut self.ebpf,
            self.config.program_log_level,
        )?)
    }

    /// The socket iterators that close the sockets of backends that left, or why they
    /// could not be loaded; once.
    pub fn take_destroy_programs(&mut self) -> Option<Result<DestroyPrograms, DestroyUnavailable>> {
        self.destroy.take()
    }

    /// Attaches the programs (or replaces those a previous agent left attached). Called
    /// after [`Self::attach_tc`]: from here on only these programs run, so the flow
    /// entries of maps replaced with another size are carried over a last time.
    pub fn attach(&mut self) -> Result<Vec<(&'static str, Attachment)>, DataplaneError> {
        self.load_programs()?;
        let attached = cgroup::attach(&mut self.ebpf, &self.config.pin_dir, &self.cgroup)
            .map_err(|error| DataplaneError::from(error).explain_refusal())?;
        carry_over(&self.config.pin_dir, "after the programs were swapped");
        carry::finish(&self.config.pin_dir);
        seed_flow_filter(&self.config.pin_dir);
        Ok(attached)
    }

    /// Attaches the TC programs of each device's role to `devices` but those of `done`
    /// (attached before by this agent; a previous agent's are replaced), and detaches them
    /// from devices no longer listed.
    pub fn attach_tc(
        &mut self,
        devices: &[TcDevice],
        done: &[TcDevice],
        mode: TcMode,
    ) -> Result<TcAttached, DataplaneError> {
        self.load_programs()?;
        tc::attach(&mut self.ebpf, &self.config.pin_dir, devices, done, mode)
            .map_err(|error| DataplaneError::Tc(Box::new(error)).explain_refusal())
    }
}

/// Copies the entries of the maps a load replaced with another size into their new maps
/// (see `carry`). A failure is logged: the flows it misses are reset, as they would be
/// without the copy, and the agent serves on.
fn carry_over(pin_dir: &Path, when: &str) {
    match carry::copy(pin_dir) {
        Ok(0) => {}
        Ok(entries) => info!(
            entries,
            when,
            "conntrack and affinity entries carried over into the new maps (resized or renamed)"
        ),
        Err(error) => warn!(
            error = %crate::error_chain(&error),
            when,
            "cannot carry conntrack and affinity entries over into the resized maps: the \
             flows they held start anew (SNATed flows from outside are reset)"
        ),
    }
}

/// Rebuilds the flow filter from the entries in the conntrack tables and trusts it (see
/// `flow_filter`). A failure is logged: the filter stays distrusted, and the programs look
/// up every packet, as they did before it existed.
fn seed_flow_filter(pin_dir: &Path) {
    match flow_filter::seed(pin_dir) {
        Ok(entries) => debug!(entries, "flow filter rebuilt from the conntrack tables"),
        Err(error) => warn!(
            error = %crate::error_chain(&error),
            "cannot seed the flow filter: the TC programs look up every packet in conntrack \
             (correct, but slower)"
        ),
    }
}

/// A source-range trie of either family.
fn take_trie<K: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<aya::maps::LpmTrie<MapData, K, socklb_abi::SourceVerdict>, DataplaneError> {
    take_map(ebpf, name)?
        .try_into()
        .map_err(|source| DataplaneError::Map { name, source })
}
