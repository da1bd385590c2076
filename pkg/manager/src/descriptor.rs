//! A controller as `cmd` and the manager see it, in kube-controller-manager's shape: a descriptor with a
//! canonical name, aliases and on-by-default, and the controller's own options behind one trait —
//! checking its flags, saying its effective configuration and worker count, building it, and the work
//! it does while this process stands by. Nothing outside a controller's crate knows its flags.

use std::error::Error;
use std::fmt;

use futures::future::BoxFuture;

use crate::client::ClientOptions;
use crate::controller::{InitContext, InitResult};
use crate::flags::GenericFlags;

/// A controller's flags and what it does with them; implemented once per controller crate.
pub trait ControllerOptions: Send + Sync + 'static {
    /// Why the flags are refused; its message names the flag and the rule.
    type FlagError: Error + Send + Sync + 'static;

    /// Checks the flags, with the generic ones they depend on, before anything touches the API.
    fn validate(&self, generic: &GenericFlags) -> Result<(), Self::FlagError>;

    /// The settings logged at startup and published on the Lease, as `--flag` → value.
    fn effective_config(&self) -> Vec<(String, String)>;

    /// How many keys the main queue syncs at once (its `--concurrent-*` flag).
    fn workers(&self) -> usize;

    /// Builds the controller, or `None` when its flags turn it off; spawns nothing.
    fn init(&self, ctx: &InitContext) -> InitResult;

    /// Work to do while this process stands by under leader election, if any (it is never leader yet).
    fn standby(&self, _ctx: &StandbyContext) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

/// What a standby task may use: it runs before the manager, so it builds its own client.
#[derive(Debug, Clone)]
pub struct StandbyContext {
    /// How to reach the API server (the generic flags; set your own `user_agent`).
    pub client: ClientOptions,
    /// The Node this process runs on (`NODE_NAME`), if known.
    pub node_name: Option<String>,
}

/// A controller's flag values break its rules.
#[derive(Debug)]
pub struct ControllerFlagError {
    /// The controller's canonical name.
    pub controller: &'static str,
    error: Box<dyn Error + Send + Sync>,
}

impl fmt::Display for ControllerFlagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The controller's message already names the flag; the user knows flags, not controllers.
        self.error.fmt(f)
    }
}

impl Error for ControllerFlagError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error.source()
    }
}

/// [`ControllerOptions`] with its error type erased, so one registry holds every controller.
trait DynOptions: Send + Sync {
    fn validate(&self, generic: &GenericFlags) -> Result<(), Box<dyn Error + Send + Sync>>;
    fn effective_config(&self) -> Vec<(String, String)>;
    fn workers(&self) -> usize;
    fn init(&self, ctx: &InitContext) -> InitResult;
    fn standby(&self, ctx: &StandbyContext) -> Option<BoxFuture<'static, ()>>;
}

impl<T: ControllerOptions> DynOptions for T {
    fn validate(&self, generic: &GenericFlags) -> Result<(), Box<dyn Error + Send + Sync>> {
        ControllerOptions::validate(self, generic).map_err(|e| Box::new(e) as _)
    }
    fn effective_config(&self) -> Vec<(String, String)> {
        ControllerOptions::effective_config(self)
    }
    fn workers(&self) -> usize {
        ControllerOptions::workers(self)
    }
    fn init(&self, ctx: &InitContext) -> InitResult {
        ControllerOptions::init(self, ctx)
    }
    fn standby(&self, ctx: &StandbyContext) -> Option<BoxFuture<'static, ()>> {
        ControllerOptions::standby(self, ctx)
    }
}

/// A controller the manager can start: its canonical name, aliases and options.
pub struct ControllerDescriptor {
    /// Canonical name, matching `^[a-z]([-a-z]*[a-z])?$`.
    pub name: &'static str,
    /// Other names accepted in `--controllers` (e.g. KCM's `nodeipam`).
    pub aliases: &'static [&'static str],
    /// Whether `*` leaves this controller off.
    pub disabled_by_default: bool,
    options: Box<dyn DynOptions>,
}

impl fmt::Debug for ControllerDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerDescriptor")
            .field("name", &self.name)
            .field("aliases", &self.aliases)
            .field("disabled_by_default", &self.disabled_by_default)
            .finish()
    }
}

impl ControllerDescriptor {
    /// A controller that `*` turns on.
    pub fn new(
        name: &'static str,
        aliases: &'static [&'static str],
        options: impl ControllerOptions,
    ) -> Self {
        Self {
            name,
            aliases,
            disabled_by_default: false,
            options: Box::new(options),
        }
    }

    /// The same controller, left off by `*` (it runs only when named in `--controllers`).
    pub fn disabled_by_default(mut self) -> Self {
        self.disabled_by_default = true;
        self
    }

    /// [`ControllerOptions::validate`], naming the controller.
    pub fn validate(&self, generic: &GenericFlags) -> Result<(), ControllerFlagError> {
        self.options
            .validate(generic)
            .map_err(|error| ControllerFlagError {
                controller: self.name,
                error,
            })
    }

    /// [`ControllerOptions::effective_config`].
    pub fn effective_config(&self) -> Vec<(String, String)> {
        self.options.effective_config()
    }

    /// [`ControllerOptions::workers`], at least 1.
    pub fn workers(&self) -> usize {
        self.options.workers().max(1)
    }

    /// [`ControllerOptions::init`].
    pub fn init(&self, ctx: &InitContext) -> InitResult {
        self.options.init(ctx)
    }

    /// [`ControllerOptions::standby`].
    pub fn standby(&self, ctx: &StandbyContext) -> Option<BoxFuture<'static, ()>> {
        self.options.standby(ctx)
    }
}
