//! The `pool` and `state` sections: the shape of the chain's pools and state store.

use saphyr::MarkedYaml;
use zerohop_pool::{META_RESERVE, SLOT_HEADER_LEN};

use crate::plan::StatePlan;
use crate::yaml::{get, line, shown_key, Cx, Map};
use crate::*;

impl Cx {
    pub(crate) fn pool(&self, n: &MarkedYaml<'_>) -> Result<PoolSpec, SpecError> {
        let map = self.mapping(n, "pool")?;
        self.only_known(
            &map,
            "pool.",
            &["slots", "slot_size", "hugepages", "large_slots"],
        )?;
        let slots = match get(&map, "slots") {
            None => DEFAULT_SLOTS,
            Some(v) => self.integer(v, "pool.slots", 1, 1 << 24)? as u32,
        };
        let slot_size = match get(&map, "slot_size") {
            None => DEFAULT_SLOT_SIZE,
            Some(v) => {
                let s = self.size(v, "pool.slot_size")?;
                let min = (SLOT_HEADER_LEN + META_RESERVE + 64) as u64;
                if s < min || s > (1 << 30) || s % 64 != 0 {
                    return Err(self.err(
                        line(v),
                        "pool.slot_size",
                        format!("must be a multiple of 64 bytes between {min} and 1GiB, got {s}"),
                    ));
                }
                s as u32
            }
        };
        let hugepages = match get(&map, "hugepages") {
            None => false,
            Some(v) => self.boolean(v, "pool.hugepages")?,
        };
        let large_slots = match get(&map, "large_slots") {
            None => DEFAULT_LARGE_SLOTS,
            Some(v) => self.integer(v, "pool.large_slots", 0, i64::from(MAX_LARGE_SLOTS))? as u32,
        };
        let total = slots as u64 * slot_size as u64;
        if total > 64 << 30 {
            return Err(self.err(
                line(n),
                "pool",
                format!("{slots} slots of {slot_size} bytes is {total} bytes, more than 64GiB"),
            ));
        }
        Ok(PoolSpec {
            slots,
            slot_size,
            hugepages,
            large_slots,
        })
    }

    /// The top-level `state` section, checked against the functions that use it.
    pub(crate) fn state(
        &self,
        top: &Map<'_, '_>,
        functions: &[FunctionSpec],
    ) -> Result<Option<StatePlan>, SpecError> {
        let user = functions.iter().find(|f| f.state);
        let Some(n) = get(top, "state") else {
            if let Some(f) = user {
                return Err(self.err(
                    f.line,
                    &format!("functions.{}.state", shown_key(&f.name)),
                    "the chain has no `state` section; add e.g. `state: { entries: 4096, \
                     value_size: 4KiB }`",
                ));
            }
            return Ok(None);
        };
        let map = self.mapping(n, "state")?;
        self.only_known(&map, "state.", &["entries", "value_size"])?;
        if user.is_none() {
            return Err(self.err(
                line(n),
                "state",
                "no function has `state: true`, so nothing could use the store; add it to the \
                 functions that read or write state, or remove this section",
            ));
        }
        let entries = match get(&map, "entries") {
            None => DEFAULT_STATE_ENTRIES,
            Some(e) => self.integer(
                e,
                "state.entries",
                1,
                i64::from(zerohop_pool::state::ENTRIES_MAX),
            )? as u32,
        };
        let value_size = match get(&map, "value_size") {
            None => DEFAULT_STATE_VALUE,
            Some(v) => {
                let size = self.size(v, "state.value_size")?;
                let max = u64::from(zerohop_pool::state::VALUE_MAX);
                if size == 0 || size > max {
                    return Err(self.err(
                        line(v),
                        "state.value_size",
                        format!("{size} bytes; a value may be 1 byte to 1MiB"),
                    ));
                }
                size as u32
            }
        };
        Ok(Some(StatePlan {
            entries,
            value_size,
        }))
    }
}
