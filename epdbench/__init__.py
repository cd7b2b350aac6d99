"""epdbench: compare aggregated, PD- and EPD-disaggregated LLM serving on matched, seeded workloads.

One namespace; the design card's top-level folders install as its sub-packages. Layers, each importing
only those below it (declared in pyproject.toml's [tool.importlinter], checked by the test suite):

    epdbench.cli
    epdbench.flows                        sequencing (Prefect)
    epdbench.tasks                        side effects: processes, load, evidence, results, MLflow
    epdbench.sim | epdbench.manifests     the simulator; Kubernetes templates
    epdbench.relay                        streaming an HTTP response back (shared by sim and tasks)
    epdbench.reports                      report rendering (pure)
    epdbench.analysis                     statistics, verdicts, estimates (pure)
    epdbench.specs : epdbench.physics     models, presets, workload synthesis, command lines; the cost
                                          model (one layer: physics reads the model and hardware specs)
    epdbench.templating                   the one Jinja environment of reports and manifests (pure)
"""
