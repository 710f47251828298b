//! What the audit tests share: an edited artifact's body sealed again, as a forger would.

use serde_json::Value;

/// `body` (as `read_artifact` gives it: without its seal) with a seal of its own contents.
pub fn sealed(mut body: Value) -> Value {
    let seal = common::artifact::seal(&body);
    body.as_object_mut().unwrap().insert(common::artifact::SEAL_KEY.into(), serde_json::to_value(seal).unwrap());
    body
}
