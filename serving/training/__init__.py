"""The bundled trainer: `serving train RECIPE.yaml` trains a model on Ray Train and writes it where
endpoints load it.

`recipe` (the document), `data` (checking and fingerprinting the rows), `session` (what a training
loop sees of the cluster), one loop per framework (`torch_loop`, `tf_loop`, `xgboost_loop`,
`lightgbm_loop`, `sklearn_fit`; the two boosted-tree loops end alike: `boosted_trees`), `versions` (the model store's layout: STORE/NAME/VERSION/model.tar.gz
+ model.json) and `runner` (the whole run). The Ray Train side lives in serving/ray_wing/training.py, like every
other use of Ray.

Also `torch_models` (the PyTorch model families), `torch_export` (TorchScript and ONNX exports) and
`tf_models` (the TensorFlow family, its optimizer and SavedModel); `run_records` types what a run
passes around and writes (the setup a loop is handed, result.json, model.json).
"""
