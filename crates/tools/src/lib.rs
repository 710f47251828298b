//! The workspace tools' shared part: the registry of experiments that `reproduce`, `audit`,
//! `pin` and `report` dispatch through.

pub mod registry;
