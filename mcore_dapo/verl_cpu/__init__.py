"""verl on the CPU: what this project registers with verl where no accelerator is.

* :mod:`.platform`: verl's ``cpu`` platform (gloo, Ray's logical GPU slots), picked by verl only where
  :func:`mcore_dapo.devices.detect` says ``cpu``;
* :mod:`.engine`: the plugin's Megatron engine for verl's ``cpu`` device (load and offload told apart
  where the device and the host are both "cpu");
* :mod:`.rollout`: the ``hf_cpu`` rollout (an HF transformers server, replica and worker adapter), the
  stand-in for vLLM where vLLM's CPU build is not installed.

The product (:mod:`mcore_dapo.verl_plugin`) imports this package from its entry point only, to register
these with verl.
"""
