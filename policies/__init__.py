"""Controller policies shipped with autospec (YAML), installed as the ``autospec.policies``
package; read through :func:`autospec.shipped.shipped_dir`."""
