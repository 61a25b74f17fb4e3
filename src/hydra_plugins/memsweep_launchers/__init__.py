"""memsweep's Hydra launchers: Hydra instantiates launchers only from the `hydra_plugins` namespace."""
