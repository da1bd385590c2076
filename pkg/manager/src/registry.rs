//! The controller registry: descriptors by canonical name, aliases, and `--controllers` resolution with
//! kube-controller-manager's rules (`*` enables the on-by-default set, `foo` enables, `-foo` disables, the
//! first explicit match wins, unknown names are an error).

use std::collections::BTreeMap;

use crate::controller::InitFn;

/// A controller the manager can start: its canonical name, aliases and init function.
pub struct ControllerDescriptor {
    /// Canonical name, matching `^[a-z]([-a-z]*[a-z])?$`.
    pub name: &'static str,
    /// Other names accepted in `--controllers` (e.g. KCM's `nodeipam`).
    pub aliases: &'static [&'static str],
    /// Whether `*` leaves this controller off.
    pub disabled_by_default: bool,
    /// Builds the controller; starts nothing.
    pub init: InitFn,
}

impl std::fmt::Debug for ControllerDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerDescriptor")
            .field("name", &self.name)
            .field("aliases", &self.aliases)
            .field("disabled_by_default", &self.disabled_by_default)
            .finish()
    }
}

/// A registry or `--controllers` value that breaks the rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// A name or alias does not match KCM's naming rule.
    #[error("controller name {0:?} must match ^[a-z]([-a-z]*[a-z])?$")]
    InvalidName(String),
    /// Two descriptors claim the same name or alias.
    #[error("controller name or alias {0:?} is registered twice")]
    Duplicate(String),
    /// `--controllers` names a controller nobody registered.
    #[error("--controllers: {name:?} is not in the list of known controllers (known: {known})")]
    Unknown {
        /// The unknown entry.
        name: String,
        /// The canonical names, comma-separated.
        known: String,
    },
}

/// The map of controllers by canonical name, in start order.
#[derive(Debug)]
pub struct Registry {
    descriptors: Vec<ControllerDescriptor>,
    by_name: BTreeMap<&'static str, usize>,
}

fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_lowercase()
                && last.is_ascii_lowercase()
                && bytes.iter().all(|b| b.is_ascii_lowercase() || *b == b'-')
        }
        _ => false,
    }
}

impl Registry {
    /// Builds a registry, checking name rules and that no name or alias is taken twice.
    pub fn new(descriptors: Vec<ControllerDescriptor>) -> Result<Self, RegistryError> {
        let mut by_name = BTreeMap::new();
        for (i, d) in descriptors.iter().enumerate() {
            for name in std::iter::once(&d.name).chain(d.aliases.iter()) {
                if !is_valid_name(name) {
                    return Err(RegistryError::InvalidName(name.to_string()));
                }
                if by_name.insert(*name, i).is_some() {
                    return Err(RegistryError::Duplicate(name.to_string()));
                }
            }
        }
        Ok(Self {
            descriptors,
            by_name,
        })
    }

    /// The canonical names, in start order.
    pub fn names(&self) -> Vec<&'static str> {
        self.descriptors.iter().map(|d| d.name).collect()
    }

    /// Maps a name or alias to its canonical name.
    pub fn canonical(&self, name: &str) -> Option<&'static str> {
        self.by_name.get(name).map(|&i| self.descriptors[i].name)
    }

    /// Checks a `--controllers` list: every entry is `*`, a known name or alias, or `-` and one.
    pub fn validate(&self, controllers: &[String]) -> Result<(), RegistryError> {
        for entry in controllers {
            let name = entry.strip_prefix('-').unwrap_or(entry);
            if name == "*" && !entry.starts_with('-') {
                continue;
            }
            if self.canonical(name).is_none() {
                return Err(RegistryError::Unknown {
                    name: entry.clone(),
                    known: self.names().join(", "),
                });
            }
        }
        Ok(())
    }

    /// Whether a controller is on, by KCM's `IsControllerEnabled`: the first explicit match wins, then `*`.
    pub fn is_enabled(&self, descriptor: &ControllerDescriptor, controllers: &[String]) -> bool {
        let mut has_star = false;
        for entry in controllers {
            if entry == "*" {
                has_star = true;
                continue;
            }
            let (negated, name) = match entry.strip_prefix('-') {
                Some(n) => (true, n),
                None => (false, entry.as_str()),
            };
            if self.canonical(name) == Some(descriptor.name) {
                return !negated;
            }
        }
        has_star && !descriptor.disabled_by_default
    }

    /// The descriptors `--controllers` turns on, in start order; errors on unknown names.
    pub fn enabled(
        &self,
        controllers: &[String],
    ) -> Result<Vec<&ControllerDescriptor>, RegistryError> {
        self.validate(controllers)?;
        Ok(self
            .descriptors
            .iter()
            .filter(|d| self.is_enabled(d, controllers))
            .collect())
    }

    /// Every descriptor, in start order.
    pub fn descriptors(&self) -> &[ControllerDescriptor] {
        &self.descriptors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::{InitContext, InitResult};

    fn never(_: &InitContext) -> InitResult {
        Ok(None)
    }

    fn descriptor(
        name: &'static str,
        aliases: &'static [&'static str],
        off: bool,
    ) -> ControllerDescriptor {
        ControllerDescriptor {
            name,
            aliases,
            disabled_by_default: off,
            init: Box::new(never),
        }
    }

    fn registry() -> Registry {
        Registry::new(vec![
            descriptor("subnet-allocator", &["nodeipam"], false),
            descriptor("route-controller", &["route"], false),
            descriptor("experimental", &[], true),
        ])
        .expect("valid registry")
    }

    fn list(s: &str) -> Vec<String> {
        s.split(',').map(str::to_string).collect()
    }

    fn enabled(r: &Registry, s: &str) -> Vec<&'static str> {
        r.enabled(&list(s))
            .expect("valid list")
            .iter()
            .map(|d| d.name)
            .collect()
    }

    #[test]
    fn star_enables_every_controller_that_is_on_by_default() {
        assert_eq!(
            enabled(&registry(), "*"),
            ["subnet-allocator", "route-controller"]
        );
    }

    #[test]
    fn a_disabled_entry_before_star_wins_as_the_first_match() {
        assert_eq!(
            enabled(&registry(), "-route-controller,*"),
            ["subnet-allocator"]
        );
        assert_eq!(enabled(&registry(), "*,-route"), ["subnet-allocator"]);
    }

    #[test]
    fn the_first_explicit_match_wins_over_a_later_one() {
        assert_eq!(enabled(&registry(), "route,-route"), ["route-controller"]);
        assert!(enabled(&registry(), "-route,route").is_empty());
    }

    #[test]
    fn without_star_only_named_controllers_run_and_off_by_default_ones_can_be_named() {
        assert_eq!(enabled(&registry(), "nodeipam"), ["subnet-allocator"]);
        assert_eq!(enabled(&registry(), "*,experimental").len(), 3);
    }

    #[test]
    fn an_unknown_controller_name_is_an_error_that_lists_the_known_ones() {
        let err = registry().enabled(&list("*,bogus")).expect_err("unknown");
        let msg = err.to_string();
        assert!(
            msg.contains("\"bogus\"") && msg.contains("subnet-allocator"),
            "{msg}"
        );
        assert!(registry().enabled(&list("-bogus")).is_err());
        assert!(registry().enabled(&list("-*")).is_err());
    }

    #[test]
    fn names_must_follow_the_kcm_naming_rule_and_be_unique() {
        for bad in ["Route", "route-", "-route", "route_controller", "", "r2"] {
            assert!(
                Registry::new(vec![descriptor(bad, &[], false)]).is_err(),
                "{bad:?} accepted"
            );
        }
        let dup = Registry::new(vec![
            descriptor("route-controller", &["route"], false),
            descriptor("route", &[], false),
        ]);
        assert_eq!(
            dup.expect_err("dup"),
            RegistryError::Duplicate("route".into())
        );
    }

    #[test]
    fn every_alias_maps_to_its_canonical_name() {
        let r = registry();
        assert_eq!(r.canonical("nodeipam"), Some("subnet-allocator"));
        assert_eq!(r.canonical("route"), Some("route-controller"));
        assert_eq!(r.canonical("nope"), None);
    }
}
