//! The pages' forms, as browsers and Locust post them: `application/x-www-form-urlencoded`
//! bodies (`product_id=OLJCESPC7Z&quantity=2`), read into the pages' types.
//!
//! Stricter than the original, which reads a number that does not parse as 0 and goes on:
//! a missing field or a number that is not one is a 400 naming the field. Fields the form
//! does not have are ignored, as a browser's extra inputs are; the first of repeated fields
//! wins, as Go's `FormValue` does.

use super::pages::{AddToCart, CheckoutForm, CurrencyChoice};
use crate::rpc::ServiceError;

/// A decoded form body: its fields in order.
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(body: &[u8]) -> Self {
        Form(
            form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of `name`, which the form must have.
    fn text(&self, name: &str) -> Result<String, ServiceError> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| ServiceError::bad_request(format!("form field {name} missing")))
    }

    /// The first value of `name` as a number.
    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<T, ServiceError> {
        let text = self.text(name)?;
        text.trim().parse().map_err(|_| {
            ServiceError::bad_request(format!("form field {name} is not a number: {text:?}"))
        })
    }
}

/// The form of `POST /setCurrency` (`currency_code`).
pub fn currency_choice(body: &[u8]) -> Result<CurrencyChoice, ServiceError> {
    Ok(CurrencyChoice {
        currency_code: Form::parse(body).text("currency_code")?,
    })
}

/// The form of `POST /cart` (`product_id`, `quantity`).
pub fn add_to_cart(body: &[u8]) -> Result<AddToCart, ServiceError> {
    let form = Form::parse(body);
    Ok(AddToCart {
        product_id: form.text("product_id")?,
        quantity: form.number("quantity")?,
    })
}

/// The form of `POST /cart/checkout` (the original's fields).
pub fn checkout(body: &[u8]) -> Result<CheckoutForm, ServiceError> {
    let form = Form::parse(body);
    Ok(CheckoutForm {
        email: form.text("email")?,
        street_address: form.text("street_address")?,
        zip_code: form.text("zip_code")?,
        city: form.text("city")?,
        state: form.text("state")?,
        country: form.text("country")?,
        credit_card_number: form.text("credit_card_number")?,
        credit_card_expiration_month: form.number("credit_card_expiration_month")?,
        credit_card_expiration_year: form.number("credit_card_expiration_year")?,
        credit_card_cvv: form.text("credit_card_cvv")?,
    })
}

/// `form` as a form body, for clients (the load generator, tests).
pub fn encode_checkout(form: &CheckoutForm) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("email", &form.email)
        .append_pair("street_address", &form.street_address)
        .append_pair("zip_code", &form.zip_code)
        .append_pair("city", &form.city)
        .append_pair("state", &form.state)
        .append_pair("country", &form.country)
        .append_pair("credit_card_number", &form.credit_card_number)
        .append_pair(
            "credit_card_expiration_month",
            &form.credit_card_expiration_month.to_string(),
        )
        .append_pair(
            "credit_card_expiration_year",
            &form.credit_card_expiration_year.to_string(),
        )
        .append_pair("credit_card_cvv", &form.credit_card_cvv)
        .finish()
}

/// `POST /cart`'s form body.
pub fn encode_add_to_cart(add: &AddToCart) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("product_id", &add.product_id)
        .append_pair("quantity", &add.quantity.to_string())
        .finish()
}

/// `POST /setCurrency`'s form body.
pub fn encode_currency_choice(choice: &CurrencyChoice) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("currency_code", &choice.currency_code)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_read_as_locust_posts_them() {
        let add = add_to_cart(b"product_id=OLJCESPC7Z&quantity=7").unwrap();
        assert_eq!((add.product_id.as_str(), add.quantity), ("OLJCESPC7Z", 7));
        let body = "email=a%40b.c&street_address=1+Main+St&zip_code=94043&city=Mountain+View&\
                    state=CA&country=C%C3%B4te+d%27Ivoire&credit_card_number=4432-8015-6152-0454&\
                    credit_card_expiration_month=1&credit_card_expiration_year=2039&\
                    credit_card_cvv=672&extra=1";
        let form = checkout(body.as_bytes()).unwrap();
        assert_eq!(form.email, "a@b.c");
        assert_eq!(form.street_address, "1 Main St");
        assert_eq!(form.country, "Côte d'Ivoire");
        assert_eq!(form.credit_card_expiration_year, 2039);
        assert_eq!(checkout(encode_checkout(&form).as_bytes()).unwrap(), form);
        let choice = currency_choice(b"currency_code=EUR&currency_code=USD").unwrap();
        assert_eq!(choice.currency_code, "EUR", "the first of repeated fields");
        assert_eq!(
            currency_choice(encode_currency_choice(&choice).as_bytes()).unwrap(),
            choice
        );
        assert_eq!(
            add_to_cart(encode_add_to_cart(&add).as_bytes()).unwrap(),
            add
        );
    }

    #[test]
    fn missing_fields_and_bad_numbers_are_400_naming_the_field() {
        let e = add_to_cart(b"product_id=X").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("quantity missing"), "{e}");
        let e = add_to_cart(b"product_id=X&quantity=two").unwrap_err();
        assert!(e.message.contains("quantity is not a number"), "{e}");
        let e = add_to_cart(b"product_id=X&quantity=-1").unwrap_err();
        assert_eq!(e.status, 400);
        let e = currency_choice(b"").unwrap_err();
        assert!(e.message.contains("currency_code missing"), "{e}");
        let e = checkout(b"email=a").unwrap_err();
        assert!(e.message.contains("street_address missing"), "{e}");
    }
}
