"""A real SpecChat server on 127.0.0.1 (the embedded SmolLM2, prompt lookup), for the remote-engine tests."""
from engine.decoding.cost_model import SpeculationConfig
from engine.decoding.proposers.base import NoProposer
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.modelfiles.embedded import embedded_model_path
from engine.serving.service import ServeOptions, Service


def specchat_server(api_key: str | None = None, n_ctx: int = 1024, plain: bool = False) -> tuple[Service, Model]:
    """(the running service, its model): stop the one, then close the other. plain: no speculation."""
    model = Model(embedded_model_path(), LoadSettings(n_ctx=n_ctx, threads=2, n_seq_max=2))
    service = Service(model, NoProposer() if plain else LookupProposer(), SpeculationConfig(max_draft=8),
                      ServeOptions(port=0, parallel=2, api_key=api_key), model_id="smollm2").start()
    return service, model
