"""bitsandbytes' paged optimizer state on a GPU: the state buffers it keeps in unified memory, outside
PyTorch's caching allocator, which the trace records (capture.alive_at_step) and then takes out of every
reading of the step's events (`off_allocator`); the estimate adds their bytes to device used."""
from .events import Event

# bitsandbytes' paged optimizers (Optimizer8bit.get_state_buffer, is_paged) make the state buffers of a parameter
# of at least 1e5 elements with F.get_paged: cudaMallocManaged unified memory, outside PyTorch's caching
# allocator (a CPU tensor over the managed pointer), on the GPU until the GPU runs short. Smaller parameters'
# buffers, and the 8-bit state's absmax and qmap, are torch.zeros on the device.
PAGED_NUMEL = 100_000


def pages(param, state) -> bool:
    """Whether a paged bitsandbytes optimizer keeps this state tensor of `param` in unified memory: a state
    buffer (the parameter's shape) of a parameter of at least PAGED_NUMEL elements."""
    return param.numel() >= PAGED_NUMEL and tuple(state.shape) == tuple(param.shape)


def off_allocator(events: list[Event], categories: dict) -> tuple[list[Event], int]:
    """The events without the blocks PyTorch's allocator never sees (bitsandbytes' paged state, category
    "paged"), and those blocks' bytes: every reading of the events (the ledger's, the allocator model's, a
    run's replay, the planner's) then leaves them out, and the estimate adds them to device used."""
    paged = {e.key: e.nbytes for e in events if e.kind == "alloc" and categories.get(e.key) == "paged"}
    return [e for e in events if e.key not in paged or not e.is_block()], sum(paged.values())
