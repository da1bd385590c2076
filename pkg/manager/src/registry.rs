//! The controller registry: descriptors by canonical name, aliases, and `--controllers` resolution with
//! kube-controller-manager's rules (`*` enables the on-by-default set, `foo` enables, `-foo` disables, the
//! first explicit match wins, unknown names are an error).

use std::collections::BTreeMap;

use futures::future::BoxFuture;

use crate::descriptor::{ControllerDescriptor, ControllerFlagError, StandbyContext};
use crate::flags::GenericFlags;

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

/// `--controllers` or a controller's flags break a rule.
#[derive(Debug, thiserror::Error)]
pub enum InvalidFlags {
    /// `--controllers` names an unknown controller.
    #[error(transparent)]
    Controllers(#[from] RegistryError),
    /// An enabled controller refuses its flags.
    #[error(transparent)]
    Controller(#[from] ControllerFlagError),
}

/// Whether `--controllers` turns on the controller called `name` or one of `aliases`, by KCM's
/// `IsControllerEnabled`: the first entry naming it wins (`-` turns it off), else `*` turns on what is
/// not disabled by default. Outside the binary (the benchmarks) it answers what netcm would start.
pub fn enables(
    controllers: &[String],
    name: &str,
    aliases: &[&str],
    disabled_by_default: bool,
) -> bool {
    let mut has_star = false;
    for entry in controllers {
        if entry == "*" {
            has_star = true;
            continue;
        }
        let (negated, named) = match entry.strip_prefix('-') {
            Some(n) => (true, n),
            None => (false, entry.as_str()),
        };
        if named == name || aliases.contains(&named) {
            return !negated;
        }
    }
    has_star && !disabled_by_default
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

    /// The descriptors `--controllers` turns on, in start order; errors on unknown names.
    pub fn enabled(
        &self,
        controllers: &[String],
    ) -> Result<Vec<&ControllerDescriptor>, RegistryError> {
        self.validate(controllers)?;
        Ok(self
            .descriptors
            .iter()
            .filter(|d| enables(controllers, d.name, d.aliases, d.disabled_by_default))
            .collect())
    }

    /// Every descriptor, in start order.
    pub fn descriptors(&self) -> &[ControllerDescriptor] {
        &self.descriptors
    }

    /// Checks `--controllers` and the flags of every controller it enables, before anything touches
    /// the API.
    pub fn validate_flags(&self, generic: &GenericFlags) -> Result<(), InvalidFlags> {
        for d in self.enabled(&generic.controllers)? {
            d.validate(generic)?;
        }
        Ok(())
    }

    /// Every controller's settings, in start order, for the startup log and the Lease.
    pub fn effective_config(&self) -> Vec<(String, String)> {
        self.descriptors
            .iter()
            .flat_map(|d| d.effective_config())
            .collect()
    }

    /// The standby work of the controllers `--controllers` enables.
    pub fn standby_tasks(
        &self,
        generic: &GenericFlags,
        ctx: &StandbyContext,
    ) -> Result<Vec<BoxFuture<'static, ()>>, RegistryError> {
        Ok(self
            .enabled(&generic.controllers)?
            .into_iter()
            .filter_map(|d| d.standby(ctx))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::{InitContext, InitResult};
    use crate::descriptor::ControllerOptions;

    /// A controller that refuses its flags when told to.
    struct Options {
        refuse: bool,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("--example must be set")]
    struct Refused;

    impl ControllerOptions for Options {
        type FlagError = Refused;
        fn validate(&self, _: &GenericFlags) -> Result<(), Refused> {
            if self.refuse {
                return Err(Refused);
            }
            Ok(())
        }
        fn effective_config(&self) -> Vec<(String, String)> {
            vec![("--example".into(), self.refuse.to_string())]
        }
        fn workers(&self) -> usize {
            0
        }
        fn init(&self, _: &InitContext) -> InitResult {
            Ok(None)
        }
    }

    fn descriptor(
        name: &'static str,
        aliases: &'static [&'static str],
        off: bool,
    ) -> ControllerDescriptor {
        let d = ControllerDescriptor::new(name, aliases, Options { refuse: off });
        if off {
            d.disabled_by_default()
        } else {
            d
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

    fn generic(controllers: &str) -> GenericFlags {
        crate::test_support::parse_flags(&[&format!("--controllers={controllers}")])
            .expect("valid flags")
    }

    #[test]
    fn only_the_flags_of_enabled_controllers_are_checked_and_errors_say_what_the_controller_says() {
        let r = registry();
        assert!(r.validate_flags(&generic("*")).is_ok());
        let err = r
            .validate_flags(&generic("*,experimental"))
            .expect_err("experimental refuses its flags");
        assert_eq!(err.to_string(), "--example must be set");
        assert!(matches!(
            r.validate_flags(&generic("bogus")),
            Err(InvalidFlags::Controllers(_))
        ));
    }

    #[test]
    fn the_effective_configuration_lists_every_controller_in_start_order_and_workers_are_at_least_one(
    ) {
        let r = registry();
        assert_eq!(
            r.effective_config(),
            [
                ("--example".to_string(), "false".to_string()),
                ("--example".to_string(), "false".to_string()),
                ("--example".to_string(), "true".to_string()),
            ]
        );
        assert!(r.descriptors().iter().all(|d| d.workers() == 1));
    }
}
