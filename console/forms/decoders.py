"""The decoder rule form: a schema upload checked before it is saved (a form error, never a 500)."""

from django import forms

from recovery.models import DecoderRule
from recovery.models.decoders import SCHEMA_MAX_BYTES


class DecoderRuleForm(forms.ModelForm):
    descriptor_file = forms.FileField(
        required=False,
        label="FileDescriptorSet",
        help_text="protoc --include_imports --descriptor_set_out=orders.desc orders.proto",
    )

    registry_url = forms.URLField(
        required=False,
        assume_scheme="https",
        label="Schema registry URL",
        help_text="Confluent-compatible: GET {url}/schemas/ids/{id}.",
    )

    class Meta:
        model = DecoderRule
        fields = [
            "name",
            "position",
            "vhost",
            "queue_pattern",
            "exchange_pattern",
            "content_encoding",
            "decoder",
            "protobuf_type",
            "avro_schema",
            "registry_url",
        ]
        widgets = {"avro_schema": forms.Textarea(attrs={"rows": 4, "cols": 60})}

    def clean_descriptor_file(self):
        upload = self.cleaned_data.get("descriptor_file")
        if upload is None:
            return None
        if upload.size > SCHEMA_MAX_BYTES:
            raise forms.ValidationError(f"larger than {SCHEMA_MAX_BYTES} bytes")
        return upload.read()

    def _update_errors(self, errors):
        # The model checks the stored descriptor set; the form names the upload field.
        if hasattr(errors, "error_dict") and "descriptor_set" in errors.error_dict:
            errors.error_dict["descriptor_file"] = errors.error_dict.pop("descriptor_set")
        super()._update_errors(errors)

    def _post_clean(self):
        # The upload goes on the instance before the model's clean() checks it loads.
        if self.cleaned_data.get("descriptor_file") is not None:
            self.instance.descriptor_set = self.cleaned_data["descriptor_file"]
        super()._post_clean()
